"""Progress bars for long loops: ``tqdm`` when it is installed, else a small built-in bar with the same basics.

    from ember.progress import progress
    for batch in progress(range(steps), desc="train", unit="step"):
        ...

Both print the count, the rate (items per second) and the elapsed time, and accept
``set_postfix(loss=...)``. ``EMBER_PROGRESS=0`` disables the bar.
"""
from __future__ import annotations

import os
import sys
import time
from typing import Any, Iterable, Iterator, TextIO


class SimpleProgress:
    """A minimal tqdm-like bar: ``desc  12/45 [###-----] 27%  31.2 step/s  0.4s  loss=0.52``.

    Redraws at most every ``mininterval`` seconds on a terminal, and only at the end otherwise.
    """

    def __init__(self, iterable: Iterable[Any] | None = None, total: int | None = None, desc: str = "",
                 unit: str = "it", disable: bool = False, file: TextIO | None = None, leave: bool = True,
                 mininterval: float = 0.1, **_: Any):
        self.iterable = iterable
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)  # type: ignore[arg-type]
        self.total, self.desc, self.unit, self.disable, self.leave = total, desc, unit, disable, leave
        self.file = file if file is not None else sys.stderr
        self.mininterval = mininterval
        self.n = 0
        self.postfix = ""
        self.start = self.last_draw = time.perf_counter()
        self.interactive = bool(getattr(self.file, "isatty", lambda: False)())
        self.closed = False

    def __iter__(self) -> Iterator[Any]:
        if self.iterable is None:
            raise TypeError("this progress bar wraps no iterable")
        try:
            for item in self.iterable:
                yield item
                self.update(1)
        finally:
            self.close()

    def __enter__(self) -> SimpleProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __len__(self) -> int:
        return self.total or 0

    def update(self, n: int = 1) -> None:
        """Count ``n`` more items done."""
        self.n += n
        now = time.perf_counter()
        if not self.disable and self.interactive and now - self.last_draw >= self.mininterval:
            self.last_draw = now
            self._draw(final=False)

    def set_postfix(self, ordered_dict: dict[str, Any] | None = None, refresh: bool = True, **kwargs: Any) -> None:
        """Show ``key=value`` pairs after the bar (floats with 4 significant digits)."""
        items = {**(ordered_dict or {}), **kwargs}
        self.postfix = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in items.items())

    def set_description(self, desc: str | None = None, refresh: bool = True) -> None:
        """Change the label in front of the bar."""
        self.desc = desc or ""

    def format(self) -> str:
        """The bar as one line of text."""
        elapsed = time.perf_counter() - self.start
        rate = self.n / elapsed if elapsed > 0 else 0.0
        parts = [self.desc + ":" if self.desc else ""]
        if self.total:
            frac = min(1.0, self.n / self.total)
            width = 20
            filled = int(frac * width)
            parts.append(f"{frac * 100:3.0f}%|{'#' * filled}{'-' * (width - filled)}| {self.n}/{self.total}")
        else:
            parts.append(f"{self.n}")
        parts.append(f"[{elapsed:.1f}s, {rate:.2f} {self.unit}/s]")
        if self.postfix:
            parts.append(self.postfix)
        return " ".join(p for p in parts if p)

    def _draw(self, final: bool) -> None:
        line = self.format()
        if self.interactive:
            self.file.write("\r" + line + ("\n" if final else ""))
        else:
            self.file.write(line + "\n")
        self.file.flush()

    def close(self) -> None:
        """Draw the final state once."""
        if self.closed:
            return
        self.closed = True
        if not self.disable and self.leave:
            self._draw(final=True)


def progress(iterable: Iterable[Any] | None = None, **kwargs: Any) -> Any:
    """A progress bar over ``iterable`` (``tqdm.tqdm`` if installed, else :class:`SimpleProgress`).

    Keyword arguments are tqdm's (``total``, ``desc``, ``unit``, ``disable``, ``leave`` ...).
    """
    if os.environ.get("EMBER_PROGRESS", "1") in ("0", "false", "False"):
        kwargs["disable"] = True
    try:
        from tqdm import tqdm
    except ImportError:
        return SimpleProgress(iterable, **kwargs)
    return tqdm(iterable, **kwargs)


__all__ = ["SimpleProgress", "progress"]
