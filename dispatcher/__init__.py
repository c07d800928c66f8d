"""fairgate's dispatcher: the pure VTC core (``dispatcher.core``) and, later, its thin shells."""
