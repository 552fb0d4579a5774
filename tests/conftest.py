"""Suite-wide: tests marked ``cuda`` need a CUDA device and are skipped, visibly, where
torch sees none (``scripts/gpu_check.sh`` runs them on a GPU machine)."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    marked = [item for item in items if item.get_closest_marker("cuda") is not None]
    if not marked:
        return
    from worker.device import cuda_devices

    if cuda_devices() == 0:
        skip = pytest.mark.skip(reason="needs a CUDA device (none visible to torch here)")
        for item in marked:
            item.add_marker(skip)
