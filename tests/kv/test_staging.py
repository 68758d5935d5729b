"""The load step's index arrays reach the device in one copy (CUDA: tests/test_gpu.py)."""

from __future__ import annotations

import numpy as np
import torch

from inferscale_memory.kv.rope import RotaryShift
from inferscale_memory.kv.staging import HostStage


def test_each_array_is_sent_whole_and_stays_valid_after_the_next() -> None:
    stage = HostStage(torch.device("cpu"), capacity=4)
    first = np.arange(6, dtype=np.int64).reshape(2, 3)
    sent = stage.to_device(first)
    first[:] = -1  # the caller reuses its array
    later = stage.to_device(np.arange(12, dtype=np.int32).reshape(3, 4))
    assert sent.tolist() == [[0, 1, 2], [3, 4, 5]]
    assert later.dtype == torch.int64 and later.shape == (3, 4)
    assert later.tolist() == np.arange(12).reshape(3, 4).tolist()
    assert stage.copies == 2 and not stage.pinned


def test_a_rotation_from_device_deltas_equals_the_host_checked_one() -> None:
    inv = 1.0 / (10000 ** (torch.arange(0, 8, 2, dtype=torch.float32) / 8))
    shift = RotaryShift(inv, 8, True).on(torch.device("cpu"))
    deltas = torch.tensor([0, 7, -2, 300])
    prepared = shift.prepare(deltas, torch.device("cpu"))
    direct = shift.rotation(deltas)
    assert prepared is not None
    assert torch.equal(prepared.cos, direct.cos) and torch.equal(prepared.sin, direct.sin)
    assert direct.moved.tolist() == [False, True, True, True]
    assert shift.prepare(torch.zeros(3, dtype=torch.int64), torch.device("cpu")) is None


def test_a_rotation_looks_its_angles_up_in_one_table_per_device() -> None:
    """The load step computes no cos/sin of its own: the angles come from a table of the
    deltas 0 .. reach - 1, built once and grown (kept whole) when a longer move comes."""
    inv = 1.0 / (10000 ** (torch.arange(0, 8, 2, dtype=torch.float32) / 8))
    shift = RotaryShift(inv, 8, True).on(torch.device("cpu"))
    deltas = torch.tensor([0, 7, -7, 1023, -300])
    rotation = shift.rotation(deltas, reach=1024)
    angles = deltas.abs().to(torch.float32)[:, None] * inv[None, :]
    assert torch.equal(rotation.cos[:, 0], angles.cos())
    sign = torch.tensor([1.0, 1.0, -1.0, 1.0, -1.0])[:, None]
    assert torch.equal(rotation.sin[:, 0], angles.sin() * sign)
    assert rotation.moved.tolist() == [False, True, True, True, True]

    table = rotation.table
    assert shift.rotation(torch.tensor([5, -9]), reach=10).table is table  # reused
    longer = shift.rotation(torch.tensor([4000]))  # the reach read from the deltas
    assert longer.table.reach >= 4001 and longer.table is not table
    assert torch.equal(longer.table.cos[:table.reach], table.cos)
    assert shift.rotation(deltas, reach=1024).table is longer.table
