"""A test-only patch for vLLM 0.32: its KV-cache manager refuses new requests while a control file exists.

Never part of stallprobe: tests/realvllm.py copies this file into the vLLM test venv's site-packages, with a
one-line `.pth` file that imports it in every interpreter the venv starts. It does nothing unless the
environment variable STALLPROBE_TEST_REFUSE_KV names a control file; then, when vLLM imports its KV-cache
manager, `KVCacheManager.allocate_slots` is wrapped so that, while that file exists, it answers None (no room)
for any request that holds no KV blocks yet. Removing the file lets admission resume.

Why it is shaped so:
- The scheduler asks `allocate_slots` before it admits a waiting request; None makes it stop its scan of the
  waiting queue there (`break`), leaving the request waiting as "capacity", neither running nor "deferred".
  That is how a leaked KV cache wedges vLLM: new requests wait forever while the engine core keeps
  stepping and its page stays fresh and frozen. Refusing at the manager, not in the scheduler, leaves every
  other path of the scheduler as vLLM wrote it.
- Only requests without blocks are refused: running requests ask for slots on every step as they grow, and
  they must finish normally, so that the wedge is "running 0, waiting N" and not a preemption storm. A
  request's blocks are read with the coordinator's `get_blocks`, which has no side effect (a `.get` per
  KV-cache group).
- vLLM starts its engine core as a separate process, and on the CPU platform always with the `spawn` method
  (vllm/platforms/cpu.py sets VLLM_WORKER_MULTIPROC_METHOD=spawn): a fresh interpreter, which runs the venv's
  `.pth` files again, so the hook is installed there as in the API server; under `fork` the child would
  inherit the installed hook (or the patched class) instead. Each patched process says so on stderr (the
  server's log), with its pid.
- An import hook rather than an import of vLLM here: the `.pth` runs in every interpreter of the venv (pip,
  the model writer), which must not pay for importing vLLM; without the variable the cost is one dict lookup.
- The control file is looked up on every call (a stat): the engine core calls this a few times per step, and
  it must see the file come and go without any other signal.
"""

from __future__ import annotations

import os
import sys
from typing import Any

ENV = "STALLPROBE_TEST_REFUSE_KV"
TARGET = "vllm.v1.core.kv_cache_manager"


def patch(module: Any, control: str) -> None:
    """Wrap `module.KVCacheManager.allocate_slots` (vLLM 0.32) to refuse new requests while `control` exists."""
    manager = module.KVCacheManager
    original = manager.allocate_slots

    def allocate_slots(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        if os.path.exists(control) and not any(self.coordinator.get_blocks(request.request_id)):
            return None  # "no free blocks": the scheduler leaves the request waiting, for capacity
        return original(self, request, *args, **kwargs)

    allocate_slots.__wrapped__ = original  # type: ignore[attr-defined]
    manager.allocate_slots = allocate_slots
    print(f"stallprobe test patch: {TARGET}.KVCacheManager.allocate_slots refuses new requests while {control} "
          f"exists (pid {os.getpid()})", file=sys.stderr, flush=True)  # fmt: skip


class Hook:
    """A meta path finder that patches TARGET right after its module body has run."""

    def __init__(self, control: str) -> None:
        self.control = control

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != TARGET:
            return None
        for finder in sys.meta_path:  # the real spec, from the finders after this one
            if isinstance(finder, Hook) or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                break
        else:
            return None
        loader: Any = spec.loader  # Any: mypy forbids assigning to a method of a typed loader
        execute = loader.exec_module
        control = self.control

        def exec_module(module: Any) -> None:
            execute(module)
            patch(module, control)

        loader.exec_module = exec_module  # this module's loader alone (one loader object per source file)
        return spec


def install() -> None:
    """Install the hook when ENV names a control file; the `.pth` file calls this at interpreter start."""
    control = os.environ.get(ENV)
    # Once per interpreter: `site` may run the `.pth` twice (the venv's lib64 is a link to its lib).
    if not control or any(isinstance(finder, Hook) for finder in sys.meta_path):
        return
    if TARGET in sys.modules:  # imported before the hook (never under spawn): patch it where it stands
        patch(sys.modules[TARGET], control)
        return
    sys.meta_path.insert(0, Hook(control))
