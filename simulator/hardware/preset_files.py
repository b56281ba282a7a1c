"""Hardware presets as a read-only mapping over the TOML files of simulator/data/hardware/<kind>/.

The files are read on first use, not at import time; the mapping keeps dict behaviour (``in``,
``[]``, ``items()``, ``get``) so callers index presets by name as before.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parents[1] / "data" / "hardware"


class PresetFiles(Mapping):
    """Presets of one kind ("gpus" | "clusters"), keyed by the ``name`` each file declares."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._specs: dict | None = None

    def directory(self) -> Path:
        return DATA_DIR / self.kind

    def _all(self) -> dict:
        if self._specs is None:
            from .hwfile import read_cluster_file, read_gpu_file
            read = read_gpu_file if self.kind == "gpus" else read_cluster_file
            specs = {}
            for path in sorted(self.directory().glob("*.toml")):
                spec = read(path)
                if spec.name != path.stem:
                    raise ValueError(f"hardware file {path}: name {spec.name!r} differs from the file name")
                specs[spec.name] = spec
            self._specs = specs
        return self._specs

    def __getitem__(self, name: str):
        return self._all()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())
