"""fp8 KV caches: the probe reads their bytes, and injection moves keys as vLLM quantizes.

Synthetic quantizing writers stand in for vLLM's (they store ``x / scale`` as float8
bytes in the layouts of ``test_cache_map.py``); ``test_cache_map.py`` runs vLLM's own CPU
fp8 writer, and ``tests/test_fp8_engine.py`` a whole engine.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from types import ModuleType, SimpleNamespace

import numpy as np
import pytest
import torch
from test_cache_map import BS, NB, cpu_tiled, flash_like, permuted

from inferscale_memory.connector.params import FactKey
from inferscale_memory.connector.plan import LoadOp, StepPlan
from inferscale_memory.connector.worker import WorkerSide
from inferscale_memory.kv.cache_map import Fp8Probe, flat_view, probe_cache_map
from inferscale_memory.kv.paged import PagedCaches, PagedLayer
from inferscale_memory.kv.pool import PoolEntry
from inferscale_memory.kv.quant import Fp8Cache, exact_ints, fp8_format, layer_scales
from inferscale_memory.kv.rope import RotaryShift
from inferscale_memory.kv.slab import KVSlab
from inferscale_memory.kv.tiers import FactTiers

LAYERS, HEADS, DIM = 3, 2, 8
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
Writer = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None]


def quantizing(make: Callable[..., tuple[torch.Tensor, Writer]], fmt: torch.dtype,
               k_scale: torch.Tensor, v_scale: torch.Tensor) -> tuple[torch.Tensor, Writer]:
    """A byte cache of ``make``'s layout whose writer takes bf16 rows and stores them as
    vLLM's fp8 writer does: ``x / scale`` (per head), saturated, rounded to ``fmt``."""
    cache, place = make(torch.uint8)
    limit = float(torch.finfo(fmt).max)

    def to_bytes(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        scaled = (x.to(torch.float32) / scale[:, None]).clamp(-limit, limit)
        return scaled.to(fmt).view(torch.uint8)

    def write(k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
        assert k.dtype == torch.bfloat16  # the model's dtype, as vLLM's writer takes
        place(to_bytes(k, k_scale), to_bytes(v, v_scale), slots)

    return cache, write


SCALES = {"one": (1.0, 1.0), "odd": (0.37, 2.5), "per_head": ([0.5, 3.0], [1.25, 0.2])}


def scales_of(name: str) -> tuple[torch.Tensor, torch.Tensor]:
    k, v = SCALES[name]
    both = layer_scales(torch.tensor(k), torch.tensor(v), HEADS)
    return both[0], both[1]


@pytest.mark.parametrize("fmt", [E4M3, E5M2], ids=str)
@pytest.mark.parametrize("scales", list(SCALES))
@pytest.mark.parametrize("make", [flash_like, cpu_tiled, permuted], ids=lambda f: f.__name__)
def test_the_probe_finds_an_fp8_layout_as_it_finds_a_bf16_one(make, scales: str,
                                                              fmt: torch.dtype) -> None:
    k_scale, v_scale = scales_of(scales)
    cache, write = quantizing(make, fmt, k_scale, v_scale)
    probe = Fp8Probe(fmt, torch.bfloat16, k_scale, v_scale)
    got = probe_cache_map(cache, write, BS, HEADS, DIM, probe)
    want = probe_cache_map(*make(torch.float32), BS, HEADS, DIM)
    assert torch.equal(got.offsets, want.offsets)
    assert got.block_stride == want.block_stride
    assert not cache.any()  # left zeroed


def test_digits_past_the_exact_integers_would_collide() -> None:
    # Why the probe's base is 16 for e4m3 and 8 for e5m2: the next integer rounds away.
    for fmt, exact in ((E4M3, 16), (E5M2, 8)):
        assert exact_ints(fmt) == exact
        ints = torch.arange(1, exact + 2, dtype=torch.float32)
        back = ints.to(fmt).to(torch.float32)
        assert torch.equal(back[:exact], ints[:exact])
        assert back[exact] != ints[exact]


def test_quantize_saturates_and_rounds_as_vllms_writer() -> None:
    fp8 = Fp8Cache(E4M3, torch.ones(1, 2, 1))
    scale = torch.tensor([2.0])
    values = torch.tensor([[1000.0, -1e6, 3.0, 0.0, 2.0 * 17.0]])  # 17 -> 16 (even)
    got = fp8.quantize(values, scale, torch.empty(0, dtype=torch.uint8))
    assert got.dtype == torch.uint8
    assert got.view(E4M3).to(torch.float32).tolist() == [[448.0, -448.0, 1.5, 0.0, 16.0]]
    assert torch.equal(fp8.dequantize(got, scale), torch.tensor([[896.0, -896.0, 3.0, 0.0,
                                                                   32.0]]))


def test_layer_scales_take_scalars_or_one_per_head() -> None:
    both = layer_scales(torch.tensor(0.5), 2.0, 3)
    assert both.tolist() == [[0.5] * 3, [2.0] * 3]
    assert layer_scales(torch.tensor([1.0, 2.0, 3.0]), 1.0, 3)[0].tolist() == [1.0, 2.0, 3.0]
    with pytest.raises(ValueError, match="2 elements; expected 1 or one per KV head"):
        layer_scales(torch.tensor([1.0, 2.0]), 1.0, 3)


def test_fp8_format_names() -> None:
    assert fp8_format("fp8") == E4M3 and fp8_format("fp8_e4m3") == E4M3
    assert fp8_format("fp8_e5m2") == E5M2
    assert fp8_format("auto") is None and fp8_format(None) is None
    assert fp8_format("bfloat16") is None


# -- injection ---------------------------------------------------------------------------

def shift(rotary_dim: int = DIM, neox: bool = True) -> RotaryShift:
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32)
                                / rotary_dim))
    return RotaryShift(inv_freq, rotary_dim, neox)


def fp8_worker(fmt: torch.dtype, scales: str, make=flash_like,
               rope: RotaryShift | None = None,
               kernel: ModuleType | None = None) -> tuple[WorkerSide, list[torch.Tensor]]:
    """A worker side over ``LAYERS`` quantizing caches of ``make``'s layout, as
    ``register`` leaves it (no engine); layer i's scales are ``scales`` times (i + 1).
    ``kernel``: the fused module whose kernel writes the loads (else the portable path)."""
    side = WorkerSide(SimpleNamespace(cache_config=SimpleNamespace(block_size=BS)))
    k_scale, v_scale = scales_of(scales)
    caches, layers, layer_rows = [], [], []
    for i in range(LAYERS):
        ks, vs = k_scale * (i + 1), v_scale * (i + 1)
        cache, write = quantizing(make, fmt, ks, vs)
        probe = Fp8Probe(fmt, torch.bfloat16, ks, vs)
        module = SimpleNamespace(_k_scale=ks, _v_scale=vs, _k_scale_float=float(ks[0]),
                                 _v_scale_float=float(vs[0]))
        layers.append(PagedLayer(f"l{i}", flat_view(cache),
                                 probe_cache_map(cache, write, BS, HEADS, DIM, probe),
                                 write, module))
        caches.append(cache)
        layer_rows.append(torch.stack((ks, vs)))
    fp8 = Fp8Cache(fmt, torch.stack(layer_rows))
    rope = rope or shift()
    injector = None if kernel is None else kernel.FusedInjector(
        [layer.flat for layer in layers], layers[0].cache_map, HEADS, DIM, rope.rotary_dim,
        rope.is_neox_style, fp8)
    side.caches = PagedCaches(layers, rope, fp8, injector)
    side._fp8_scales = side._scale_floats()
    side.tiers = FactTiers(KVSlab(LAYERS, HEADS, DIM, torch.uint8, "cpu", capacity=64))
    return side, caches


def random_bytes(shape: tuple[int, ...], fmt: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * 4).to(fmt).view(torch.uint8)


def put_fact(side: WorkerSide, key: FactKey, tokens: int, start: int, seed: int) -> np.ndarray:
    """A captured fact of random bytes (positions ``start``...) in new slab rows."""
    assert side.tiers is not None and side.caches is not None and side.caches.fp8 is not None
    rows = side.tiers.device.allocate_rows(tokens)
    side.tiers.device.data[torch.from_numpy(rows)] = random_bytes(
        (tokens, LAYERS, 2, HEADS, DIM), side.caches.fp8.dtype, seed)
    side.tiers.pool.put(key, PoolEntry(rows, start, 0))
    return rows


A, B = FactKey("alice", "a"), FactKey("alice", "b")


@pytest.mark.parametrize("fmt", [E4M3, E5M2], ids=str)
@pytest.mark.parametrize("scales", list(SCALES))
def test_a_fact_injected_where_captured_is_copied_bit_for_bit(fmt: torch.dtype,
                                                              scales: str) -> None:
    side, caches = fp8_worker(fmt, scales)
    rows = put_fact(side, A, 10, start=16, seed=1)
    side.start_load(StepPlan(loads=[LoadOp("r", [3, 1], [(A, 0, 10, 16)])]))
    for layer, cache in enumerate(caches):  # flash layout: block 1 holds positions 16..31
        assert torch.equal(cache[0, 1, :10], side.tiers.device.data[rows, layer, 0])
        assert torch.equal(cache[1, 1, :10], side.tiers.device.data[rows, layer, 1])


@pytest.mark.parametrize("fmt", [E4M3, E5M2], ids=str)
@pytest.mark.parametrize("scales", list(SCALES))
def test_a_moved_key_is_dequantized_rotated_and_quantized_again(fmt: torch.dtype,
                                                                scales: str) -> None:
    side, caches = fp8_worker(fmt, scales)
    rows = put_fact(side, A, 10, start=3, seed=2)
    # positions 40..49: 40..47 in the table's third block (2), 48..49 in its fourth (4)
    side.start_load(StepPlan(loads=[LoadOp("r", [5, 0, 2, 4], [(A, 0, 10, 40)])]))
    rope, deltas = shift(), torch.full((10,), 40 - 3)
    limit = float(torch.finfo(fmt).max)
    for layer, cache in enumerate(caches):
        stored = side.tiers.device.data[rows, layer]
        scale = side.caches.fp8.scales[layer]
        keys = stored[:, 0].view(fmt).to(torch.float32) * scale[0][:, None]
        want = (rope.shift(keys, deltas) / scale[0][:, None]).clamp(-limit, limit)
        want = want.to(fmt).view(torch.uint8)
        got_keys = torch.cat((cache[0, 2, 8:], cache[0, 4, :2]))
        got_values = torch.cat((cache[1, 2, 8:], cache[1, 4, :2]))
        assert torch.equal(got_keys, want)
        assert torch.equal(got_values, stored[:, 1])  # values move bit for bit
        assert not torch.equal(got_keys, stored[:, 0])  # the keys did move


def test_a_moved_key_lands_near_the_key_computed_at_its_new_position() -> None:
    # The property that matters for answers: rotating a captured fp8 key from position p
    # to q gives (within the format's rounding) the bytes vLLM would store for the same
    # pre-RoPE key computed at q.
    rope, fmt = shift(), E4M3
    g = torch.Generator().manual_seed(3)
    raw = torch.randn(6, HEADS, DIM, generator=g) * 3  # keys before RoPE
    scale = torch.tensor([0.7, 1.3])
    fp8 = Fp8Cache(fmt, torch.stack((scale, scale))[None])
    at = lambda pos: rope.shift(raw, torch.full((6,), pos))  # noqa: E731
    captured = fp8.quantize(at(5), scale, torch.empty(0, dtype=torch.uint8))
    moved = fp8.quantize(rope.shift(fp8.dequantize(captured, scale), torch.full((6,), 95)),
                         scale, captured)
    direct = fp8.dequantize(fp8.quantize(at(100), scale, captured), scale)
    error = (fp8.dequantize(moved, scale) - direct).abs()
    assert float(error.max()) <= 0.25 * float(at(100).abs().max())
    assert float(error.mean()) <= 0.1 * float(at(100).abs().mean())


def test_changed_scales_forget_every_fact() -> None:
    # A weight reload that changes a layer's scales: the stored bytes were quantized with
    # the old ones, so the facts go (their loads fail and vLLM recomputes them), rather
    # than be injected as wrong KV.
    side, caches = fp8_worker(E4M3, "one")
    put_fact(side, A, 10, start=0, seed=4)
    put_fact(side, B, 10, start=0, seed=5)
    side.start_load(StepPlan(loads=[LoadOp("r", [1], [(A, 0, 10, 0)])]))
    assert side.take_load_errors() == set() and A in side.tiers.pool
    module = side.caches.layers[1].module
    module._k_scale, module._k_scale_float = torch.tensor(4.0), 4.0
    caches[0].zero_()
    side.start_load(StepPlan(loads=[LoadOp("r", [1], [(A, 0, 10, 0)])]))
    assert len(side.tiers) == 0 and side.tiers.device.free_rows == 64
    assert side.take_load_errors() == {1}  # vLLM recomputes the block
    assert not caches[0].any()
    assert side.caches.fp8.scales[1, 0].tolist() == [4.0, 4.0]  # later captures: the new scale


# -- the fused kernel ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def interpreted() -> Iterator[ModuleType]:
    """``inferscale_memory.kv.fused`` with its kernel compiled for the interpreter."""
    pytest.importorskip("triton")
    from inferscale_memory.kv import fused

    with pytest.MonkeyPatch.context() as env:
        env.setenv("TRITON_INTERPRET", "1")
        yield importlib.reload(fused)
    importlib.reload(fused)


@pytest.mark.parametrize("fmt", [E4M3, E5M2], ids=str)
@pytest.mark.parametrize("scales", ["odd", "per_head"])
@pytest.mark.parametrize(("rotary_dim", "neox"), [(DIM, True), (DIM, False), (DIM // 2, True)])
def test_the_fused_fp8_load_equals_the_portable_path(interpreted: ModuleType, fmt: torch.dtype,
                                                    scales: str, rotary_dim: int,
                                                    neox: bool) -> None:
    rope = shift(rotary_dim, neox)
    portable, portable_caches = fp8_worker(fmt, scales, make=cpu_tiled, rope=rope)
    fused_side, fused_caches = fp8_worker(fmt, scales, make=cpu_tiled, rope=rope,
                                          kernel=interpreted)
    for side in (portable, fused_side):
        put_fact(side, A, 12, start=0, seed=10)
        put_fact(side, B, 12, start=7, seed=11)
    pieces = [(A, 0, 12, 0), (B, 0, 12, 72)]  # A where captured, B moved by 65
    plan = StepPlan(loads=[LoadOp("r", list(range(NB)), pieces)])
    portable.start_load(plan)
    fused_side.start_load(plan)
    for want, got in zip(portable_caches, fused_caches, strict=True):
        assert torch.equal(got, want)
    assert all(bool(c.any()) for c in fused_caches)


@pytest.mark.parametrize(("fmt", "mantissa", "min_exp"), [(E4M3, 3, -6), (E5M2, 2, -14)],
                         ids=["e4m3", "e5m2"])
def test_the_kernels_rounding_is_torchs(interpreted: ModuleType, fmt: torch.dtype,
                                        mantissa: int, min_exp: int) -> None:
    # Every finite value of the format, each midpoint between neighbours (the ties, which
    # go to the even one) and random values between: rounded as torch converts.
    import triton
    import triton.language as tl

    global _round_to  # the interpreter resolves a kernel's names in its module's globals
    _round_to = interpreted._round_to_float8

    @triton.jit
    def rounding(x_ptr, out_ptr, n, MANTISSA: tl.constexpr, MIN_EXP: tl.constexpr,
                 BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + i, mask=i < n)
        tl.store(out_ptr + i, _round_to(x, MANTISSA, MIN_EXP), mask=i < n)

    grid = torch.arange(256, dtype=torch.uint8).view(fmt).to(torch.float32)
    grid = grid[torch.isfinite(grid)].unique()
    middles = (grid[1:] + grid[:-1]) / 2
    g = torch.Generator().manual_seed(7)
    limit = float(grid.max())
    values = torch.cat((grid, middles, (torch.rand(4000, generator=g) * 2 - 1) * limit,
                        torch.randn(4000, generator=g) * 1e-3))
    out = torch.empty_like(values)
    rounding[(triton.cdiv(len(values), 1024),)](values, out, len(values), MANTISSA=mantissa,
                                                MIN_EXP=min_exp, BLOCK=1024)
    assert torch.equal(out, values.to(fmt).to(torch.float32))


def test_a_timed_load_step_logs_its_time(tmp_path) -> None:
    # INFERSCALE_CONNECTOR_TIMING (bench synthetic --connector-timing): each load step
    # appends one line; the line says whether the fused kernel wrote it.
    import json

    from inferscale_memory.connector.worker import TIMING_ENV

    with pytest.MonkeyPatch.context() as env:
        env.setenv(TIMING_ENV, str(tmp_path / "loads.jsonl"))
        side, _ = fp8_worker(E4M3, "one")
    put_fact(side, A, 10, start=16, seed=1)
    side.start_load(StepPlan(loads=[LoadOp("r", [3, 1], [(A, 0, 10, 16)])]))
    line = json.loads((tmp_path / "loads.jsonl").read_text())
    assert (line["requests"], line["tokens"], line["fused"]) == (1, 10, False)
    assert line["ms"] >= 0
