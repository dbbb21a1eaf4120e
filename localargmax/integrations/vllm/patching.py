"""The plugin's patch ledger: every vLLM attribute it replaces, with the value
it replaced, so each concern's patches are undone together and vLLM's own
function is reachable (tests call it side by side with the plugin's)."""

from __future__ import annotations

_LEDGER: dict[tuple[type, str], tuple[str, object]] = {}  # (class, attribute) -> (owner, vLLM's value)


def patch(owner: str, cls: type, name: str, new) -> None:
    """``setattr(cls, name, new)``, recording vLLM's value under ``owner``
    (``"logits"``, ``"adaptive"``): the class's own, as ``cls.__dict__`` holds it."""
    if (cls, name) in _LEDGER:
        raise RuntimeError(f"localargmax: {cls.__name__}.{name} is patched twice")
    _LEDGER[(cls, name)] = (owner, cls.__dict__[name])
    setattr(cls, name, new)


def undo(owner: str) -> None:
    """Put back every value ``owner`` replaced."""
    for (cls, name), (who, value) in list(_LEDGER.items()):
        if who == owner:
            setattr(cls, name, value)
            del _LEDGER[(cls, name)]


def patched(owner: str) -> bool:
    """Whether ``owner``'s patches are in place."""
    return any(who == owner for who, _ in _LEDGER.values())


def original(cls: type, name: str):
    """vLLM's own ``cls.name`` (the function the plugin replaced, or the current one)."""
    found = _LEDGER.get((cls, name))
    return cls.__dict__[name] if found is None else found[1]
