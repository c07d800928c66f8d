"""vLLM's KV cache events turned into the dispatcher's block keys (workers/engines/vllm/kv_event_keys.py):
the same keys the ingress and the dispatcher compute for the same prompt, tenant group and adapter;
removals and clears; chains this never saw the start of left out. vLLM's event types are stood in for
by plain classes of the same names and fields (the module reads no more of them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fairgate.common.prefix_hashes import block_hashes, for_adapter, hash_block_tokens, salted
from fairgate.workers.engines.vllm.kv_event_keys import KvEventKeys

VLLM_BLOCK = 32
STRIDE = hash_block_tokens(VLLM_BLOCK)  # 256 tokens: 8 of vLLM's blocks per key


@dataclass
class BlockStored:
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_name: str | None = None
    medium: str | None = "GPU"
    extra_keys: list[Any] | None = field(default=None)


@dataclass
class BlockRemoved:
    block_hashes: list[int]
    medium: str | None = "GPU"


class AllBlocksCleared:
    pass


def dispatcher_keys(tokens: list[int], group: str, adapter: str = "") -> tuple[int, ...]:
    return salted(for_adapter(block_hashes(tokens, STRIDE, "tiny"), adapter), group)


def test_stored_chains_become_the_dispatchers_keys_for_the_same_prompt_group_and_adapter():
    keys = KvEventKeys("tiny", VLLM_BLOCK)
    keys.learn_salt("salt-of-team-a", "team-a")
    tokens = list(range(1000, 1000 + 20 * VLLM_BLOCK))  # 640 tokens: 2 whole strides
    first = BlockStored(
        list(range(1, 13)),
        None,
        tokens[: 12 * VLLM_BLOCK],
        VLLM_BLOCK,
        "ad",
        "GPU",
        [("ad", "salt-of-team-a")] + [("ad",)] * 11,
    )
    rest = BlockStored(list(range(13, 21)), 12, tokens[12 * VLLM_BLOCK :], VLLM_BLOCK, "ad", "GPU")
    out = keys.translate(first) + keys.translate(rest)
    expected = dispatcher_keys(tokens, "team-a", "ad")
    assert out == [("stored", "GPU", expected[:1]), ("stored", "GPU", expected[1:2])]
    assert keys.translate(BlockStored([8, 9], 7, [], VLLM_BLOCK, "ad", "CPU")) == [("stored", "CPU", expected[:1])]
    assert keys.translate(BlockRemoved([16, 8])) == [("removed", "GPU", expected[1::-1])]
    assert keys.translate(BlockRemoved([8], "CPU")) == [("removed", "CPU", expected[:1])]
    assert keys.blocks == 18  # block 8 is gone from both media, block 16 from its only one
    assert keys.translate(AllBlocksCleared()) == [("cleared", "GPU", ())]
    assert keys.blocks == 1  # block 9 is still in host memory


def test_a_chain_begun_before_listening_or_under_an_unknown_salt_gives_no_key():
    keys = KvEventKeys("tiny", VLLM_BLOCK)
    tokens = list(range(8 * VLLM_BLOCK))
    assert keys.translate(BlockStored(list(range(50, 58)), 49, tokens, VLLM_BLOCK)) == []
    assert keys.unknown == 8
    unsalted = BlockStored(list(range(1, 9)), None, tokens, VLLM_BLOCK, extra_keys=[("someone-else",)] + [None] * 7)
    assert keys.translate(unsalted) == []
    keys.learn_salt("s", "g")
    other_salt = BlockStored(list(range(60, 68)), None, tokens, VLLM_BLOCK, extra_keys=[("s",)] + [None] * 7)
    assert keys.translate(other_salt) == [("stored", "GPU", dispatcher_keys(tokens, "g"))]
