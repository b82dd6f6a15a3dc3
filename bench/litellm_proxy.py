"""A real LiteLLM proxy for the peer benchmark and the LiteLLM tests, never a project dependency.

LiteLLM (``litellm[proxy]``: ~750 MB, a few minutes to install) lives in its own virtual environment,
``var/litellm-venv``. ``python -m bench.litellm_proxy`` installs it there; a full (not ``--quick``) run
of ``bench/bench_peers.py`` does too. The tests that need it skip, saying so, when it is not there.

Its set-up is its defaults plus what it requires or we must say: a master key (it refuses
unauthenticated calls without one), logging at error level (``LITELLM_LOG=ERROR`` and a logging config
that keeps uvicorn's access log quiet) and the local model-cost map (no route to the Internet needed).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from bench._common import stop_proc
from runtime.valkey import embedded

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / "var" / "litellm-venv"
MASTER_KEY = "sk-bench-master"
INSTALL_HINT = "python -m bench.litellm_proxy"
LOG_CONFIG = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"stderr": {"class": "logging.StreamHandler"}},
    "root": {"level": "ERROR", "handlers": ["stderr"]},
    "loggers": {name: {"level": "ERROR"} for name in ("uvicorn", "uvicorn.error", "uvicorn.access")},
}


def litellm_binary(install: bool) -> tuple[Path | None, str]:
    """``var/litellm-venv/bin/litellm``, installing it on first use; (None, why) when it cannot be."""
    binary = VENV / "bin" / "litellm"
    if binary.exists():
        return binary, "installed"
    if not install:
        return None, f"LiteLLM proxy is not installed in {VENV} (`{INSTALL_HINT}` installs it)"
    print(f"# installing litellm[proxy] into {VENV} (first use; a few minutes)", flush=True)
    steps = [
        [sys.executable, "-m", "venv", str(VENV)],
        [str(VENV / "bin" / "pip"), "install", "--quiet", "litellm[proxy]"],
    ]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["(no output)"]
            return None, f"could not install litellm[proxy] ({' '.join(step[-2:])}): {tail[0]}"
    return (binary, "installed now") if binary.exists() else (None, "pip installed no litellm command")


def litellm_version() -> str:
    done = subprocess.run(
        [str(VENV / "bin" / "python"), "-c", "import importlib.metadata as m; print(m.version('litellm'))"],
        capture_output=True,
        text=True,
    )
    return done.stdout.strip() or "?"


def openai_model(name: str, api_base: str, api_key: str, **params: Any) -> dict[str, Any]:
    """One ``model_list`` entry: ``name`` served by the OpenAI-compatible server at ``api_base``."""
    return {
        "model_name": name,
        "litellm_params": {"model": f"openai/{name}", "api_base": api_base, "api_key": api_key, **params},
    }


@contextlib.contextmanager
def litellm_proxy(
    binary: Path, models: list[dict[str, Any]], workdir: Path, *, ready_timeout_s: float = 180
) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """One LiteLLM proxy process (one worker) serving ``models``; yields its /v1 URL and the process."""
    config = workdir / "litellm.yaml"
    # JSON is YAML: no YAML writer needed here.
    config.write_text(json.dumps({"model_list": models, "general_settings": {"master_key": MASTER_KEY}}))
    log_config = workdir / "litellm-logging.json"
    log_config.write_text(json.dumps(LOG_CONFIG))
    port = embedded.free_port()
    log = (workdir / "litellm.log").open("w")
    env = {**os.environ, "LITELLM_LOG": "ERROR", "LITELLM_LOCAL_MODEL_COST_MAP": "True", "PYTHONPATH": ""}
    proc = subprocess.Popen(
        [
            *(str(binary), "--config", str(config), "--host", "127.0.0.1", "--port", str(port)),
            *("--num_workers", "1", "--log_config", str(log_config)),
        ],
        cwd=workdir,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env=env,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + ready_timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"litellm exited ({proc.returncode}); see {workdir / 'litellm.log'}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health/liveliness", timeout=1).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"litellm did not become ready within {ready_timeout_s:g} s")
            time.sleep(0.5)
        yield f"{url}/v1", proc
    finally:
        stop_proc(proc)
        log.close()


if __name__ == "__main__":
    found, why = litellm_binary(install=True)
    print(f"{found} ({why}, litellm {litellm_version()})" if found else why)
    sys.exit(0 if found else 1)
