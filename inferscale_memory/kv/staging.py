"""One host-to-device copy per load step, from page-locked memory.

A copy from pageable host memory makes CUDA wait for every kernel already queued on the
stream before it starts (and the host with it): with vLLM's asynchronous scheduling that
is the previous step's whole forward pass, for each such copy. A load step's index arrays
are therefore written into one page-locked buffer and sent in one asynchronous copy. The
buffer is reused: before it is written again the host waits for the event recorded after
the last copy from it (long finished by then, in practice).

Example:
    >>> import numpy as np
    >>> stage = HostStage(torch.device("cpu"))
    >>> stage.to_device(np.arange(6, dtype=np.int64).reshape(2, 3)).tolist()
    [[0, 1, 2], [3, 4, 5]]
"""

from __future__ import annotations

import numpy as np
import torch


class HostStage:
    """A growing page-locked int64 buffer that sends arrays to ``device``."""

    def __init__(self, device: torch.device, capacity: int = 1 << 14) -> None:
        self.device = device
        self.pinned = device.type == "cuda"  # elsewhere a plain copy is as good
        self._buffer = self._allocate(capacity)
        self._event: torch.cuda.Event | None = None  # the last copy from the buffer
        self.copies = 0  # host-to-device copies made (one per call)

    @property
    def capacity(self) -> int:
        return int(self._buffer.numel())

    def to_device(self, array: np.ndarray) -> torch.Tensor:
        """``array`` (int64) on the device, sent in one copy; the result does not alias
        the buffer, so it stays valid after the next call."""
        values = np.ascontiguousarray(array, dtype=np.int64)
        self.copies += 1
        if not self.pinned:
            return torch.from_numpy(values.copy()).to(self.device)
        if values.size > self.capacity:
            self._buffer = self._allocate(max(values.size, 2 * self.capacity))
        elif self._event is not None:
            self._event.synchronize()  # the previous copy has read the buffer
        staged = self._buffer[:values.size]
        staged.numpy()[:] = values.reshape(-1)
        out = staged.to(self.device, non_blocking=True)
        self._event = torch.cuda.Event()
        self._event.record()
        return out.view(values.shape)

    def _allocate(self, capacity: int) -> torch.Tensor:
        return torch.empty(capacity, dtype=torch.int64, pin_memory=self.pinned)
