"""The whole gateway assembled: its configuration loaded and checked (``config``, with the embedded
``default_config.yaml``), the dispatcher, workers and ingress wired into one Ray Serve application
(``app``), and the builder that Serve configs and KubeRay call (``serve_app``)."""
