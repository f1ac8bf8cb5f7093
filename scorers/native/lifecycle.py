"""One native model's instance: woken from `__init__`, slept by `close()` and dropping it, as
verl-omni's native executor does; each sleep leaves weak references behind so the next call can
say whether the instance and its parameters were really let go (not only asked to be).
"""

from __future__ import annotations

import gc
import inspect
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from scorers.base import CloseFailed
from scorers.native.loading import NativeSetupError
from scorers.residency import memory_figures, release_free_heap


def parameter_refs(instance: Any) -> list[tuple[weakref.ref[Any], int]]:
    """Weak references to the tensors of every torch module the instance holds, with their bytes."""
    import torch

    refs = []
    for value in vars(instance).values():
        if isinstance(value, torch.nn.Module):
            for tensor in [*value.parameters(), *value.buffers()]:
                refs.append((weakref.ref(tensor), tensor.numel() * tensor.element_size()))
    return refs


class ModelSlot:
    """Holds at most one instance of the model class; not thread-safe (the child's host serialises
    residency changes against scoring)."""

    def __init__(
        self, cls: type, kwargs: Mapping[str, Any], device: str, run: Callable[[Any], Any]
    ) -> None:
        """`run` completes an awaitable (an async `close()`) on the scorer's event loop."""
        self.cls, self.kwargs, self.device, self.run = cls, dict(kwargs), device, run
        self.instance: Any = None
        self.built = 0
        self._slept: weakref.ref[Any] | None = None
        self._slept_params: list[tuple[weakref.ref[Any], int]] = []

    def wake(self) -> dict[str, Any]:
        """A new instance from `__init__` (a no-op when one is awake)."""
        if self.instance is not None:
            return {"changed": False}
        try:
            self.instance = self.cls(**self.kwargs)
        except Exception as exc:
            raise NativeSetupError(
                f"model {self.cls.__qualname__}(**{sorted(self.kwargs)}) failed: {exc!r}"
            ) from exc
        self.built += 1
        return {"built": self.built, **memory_figures(self.device)}

    def sleep(self) -> dict[str, Any]:
        """`close()` if it has one, the instance dropped, garbage collected, the accelerator's cache
        emptied and free heap returned; figures before and after. A close() that raised is
        CloseFailed when the instance was released all the same (asleep: the error is the model's),
        and a plain error when it is still alive (the sleep failed)."""
        if self.instance is None:
            return {"changed": False}
        before = memory_figures(self.device)
        instance, self.instance = self.instance, None
        self._slept_params = parameter_refs(instance)
        self._slept = weakref.ref(instance)
        try:
            closed = self._close(instance)
        finally:
            del instance
            gc.collect()
            _empty_accelerator_cache(self.device)
            release_free_heap()
        figures = {"before": before, "after": memory_figures(self.device), **self.released()}
        if closed is not None:
            name = f"model {self.cls.__qualname__}"
            if figures["slept_instance_alive"]:
                raise RuntimeError(
                    f"{name}: close() raised {closed} and the instance is still referenced"
                )
            raise CloseFailed(
                f"{name}: close() raised {closed}; the instance was released all the same (asleep: "
                f"{figures['slept_param_bytes_alive']} of {figures['slept_param_bytes']} "
                f"parameter bytes still alive)"
            )
        return figures

    def _close(self, instance: Any) -> str | None:
        """Call the instance's close(), if any: what it raised, as text (the exception itself is
        dropped here, as its traceback's frames hold the instance), or None."""
        closer = getattr(instance, "close", None)
        if not callable(closer):
            return None
        try:
            result = closer()
            if inspect.isawaitable(result):
                self.run(result)
        except Exception as exc:  # noqa: BLE001 - reported by sleep(), once the instance is dropped
            return f"{type(exc).__name__}: {exc}"
        finally:
            del closer
        return None

    def released(self) -> dict[str, int]:
        """What the last sleep left alive: the instance (0 or 1) and its parameters' bytes."""
        if self._slept is None:
            return {}
        alive = sum(size for ref, size in self._slept_params if ref() is not None)
        return {
            "slept_instance_alive": int(self._slept() is not None),
            "slept_param_bytes": sum(size for _, size in self._slept_params),
            "slept_param_bytes_alive": alive,
        }


def _empty_accelerator_cache(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.empty_cache()
