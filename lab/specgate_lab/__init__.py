"""The local lab: tiny models, local engines (simulated or real vLLM CPU) and the pod bridge."""

from __future__ import annotations

import os
from pathlib import Path


def checkout() -> Path:
    """The specgate checkout whose CRDs and samples the lab applies: $SPECGATE_CHECKOUT, else the
    current directory (make and pytest run from the checkout's root)."""
    root = Path(os.environ.get("SPECGATE_CHECKOUT") or Path.cwd())
    if not (root / "crds").is_dir():
        raise FileNotFoundError(
            f"{root} has no crds/ directory: run from the specgate checkout's root, or set "
            "SPECGATE_CHECKOUT to it"
        )
    return root
