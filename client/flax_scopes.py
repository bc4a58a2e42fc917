"""Named scopes for Flax modules while tracing, whatever the user's settings.

Flax linen runs each module call under `jax.named_scope` only while its named-call switch is
on: the `flax_profile` setting (env `FLAX_PROFILE`) sets it when `flax.linen` is imported, and
`nn.enable_named_call` / `nn.disable_named_call` change it; a later
`flax.config.update("flax_profile", ...)` does not. Flax NNX opens no scopes at all. So while
tracing, linen's switch is forced on and NNX modules' `__call__` opens a scope named by the
module's attribute path from the module that called it (`layers/0`, `attn`), the outermost one
by its class (as linen does). Flax is only touched when the user has imported it.
"""

import contextlib
import functools
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import jax

_LOCK = threading.RLock()
_MARK = "_stageprof_scoped"


class _Calls(threading.local):
    """The NNX modules being called on this thread, each with its descendants' names."""

    def __init__(self) -> None:
        self.stack: list[tuple[Any, dict[int, str]]] = []


_CALLS = _Calls()


@contextlib.contextmanager
def module_scopes() -> Iterator[None]:
    """While inside: Flax linen and NNX module calls open named scopes (see the module doc)."""
    with _LOCK, contextlib.ExitStack() as stack:
        linen = sys.modules.get("flax.linen.module")
        if linen is not None:
            stack.enter_context(linen.override_named_call(True))
        nnx = sys.modules.get("flax.nnx.module")
        if nnx is not None:
            stack.enter_context(_nnx_scopes(nnx.Module, nnx.iter_modules))
        yield


@contextlib.contextmanager
def _nnx_scopes(base: type, iter_modules: Callable[[Any], Iterator]) -> Iterator[None]:
    classes, todo = [], [base]
    while todo:
        cls = todo.pop()
        if cls not in classes:
            classes.append(cls)
            todo.extend(cls.__subclasses__())
    patched = []
    try:
        for cls in classes:
            call = cls.__dict__.get("__call__")
            if callable(call) and not getattr(call, _MARK, False):
                cls.__call__ = _scoped(call, iter_modules)  # type: ignore[method-assign]
                patched.append((cls, call))
        yield
    finally:
        for cls, call in reversed(patched):
            cls.__call__ = call


def _scoped(call: Callable[..., Any], iter_modules: Callable[[Any], Iterator]) -> Callable:
    @functools.wraps(call)
    def scoped_call(self: Any, *args: Any, **kwargs: Any) -> Any:
        stack = _CALLS.stack
        if stack and stack[-1][0] is self:  # a subclass's __call__ calling super().__call__
            return call(self, *args, **kwargs)
        name = stack[-1][1].get(id(self)) if stack else None
        names = {id(m): "/".join(map(str, path)) for path, m in iter_modules(self) if path}
        stack.append((self, names))
        try:
            with jax.named_scope(name or type(self).__name__):
                return call(self, *args, **kwargs)
        finally:
            stack.pop()

    setattr(scoped_call, _MARK, True)
    return scoped_call
