"""The installed plugins' entry points, read without importing :mod:`importlib.metadata`.

Choosing the default device needs the ``ember.devices`` entry points of every installed distribution.
``importlib.metadata`` finds them, but importing it (it pulls in ``email``, ``zipfile``, ``csv`` ...) and
scanning every distribution's metadata cost ~14 ms of a fresh process's first result. Distributions
installed as folders on ``sys.path`` (``*.dist-info``, and ``*.egg-info`` of setuptools' development
installs) are read here directly: the ``Name`` and ``Version`` lines of their metadata and the group's
section of ``entry_points.txt``, the first distribution of a name on ``sys.path`` winning, as
``importlib.metadata`` does. Where it could see more (a zip archive on ``sys.path``, an import finder
that offers distributions of its own) :mod:`importlib.metadata` is used after all.
"""
from __future__ import annotations

import importlib
import importlib.machinery
import os
import re
import sys
from typing import Any


class InstalledDist:
    """A distribution's name and version, as entry points report them (``ep.dist``)."""

    def __init__(self, name: str, version: str):
        self.name, self.version = name, version

    @property
    def metadata(self) -> dict[str, str]:
        return {"Name": self.name, "Version": self.version}


class InstalledEntryPoint:
    """One entry point (``name = module:attr``) of an installed distribution."""

    def __init__(self, name: str, value: str, group: str, dist: InstalledDist):
        self.name, self.value, self.group, self.dist = name, value, group, dist

    def load(self) -> Any:
        """Import the module and return the object the entry point names."""
        module, _, attr = self.value.partition(":")
        obj: Any = importlib.import_module(module.strip())
        for part in attr.strip().split(".") if attr.strip() else ():
            obj = getattr(obj, part)
        return obj

    def __repr__(self) -> str:
        return f"EntryPoint(name={self.name!r}, value={self.value!r}, group={self.group!r})"


def entry_points(group: str) -> list[Any]:
    """``importlib.metadata.entry_points(group=group)`` (the same names, values and distributions)."""
    found = _scan(group)
    if found is None:
        import importlib.metadata

        return list(importlib.metadata.entry_points(group=group))
    return found


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _scan(group: str) -> list[InstalledEntryPoint] | None:
    """The entry points of ``group`` from the distribution folders on ``sys.path``; ``None`` when ``sys.path``
    or ``sys.meta_path`` holds something only :mod:`importlib.metadata` reads."""
    if any(hasattr(f, "find_distributions") and f is not importlib.machinery.PathFinder for f in sys.meta_path):
        return None
    seen: set[str] = set()
    out: list[InstalledEntryPoint] = []
    for entry in sys.path:
        path = entry or "."
        if os.path.isfile(path):
            return None  # a zip archive: importlib.metadata reads inside it
        try:
            names = sorted(os.listdir(path))
        except OSError:
            continue
        for folder in names:
            if not folder.endswith((".dist-info", ".egg-info")):
                continue
            # the name in the folder's: name-version.dist-info, name.egg-info, name-version-py3.egg-info
            key = _normalized(folder.rsplit(".", 1)[0].split("-", 1)[0])
            if key in seen:
                continue
            seen.add(key)
            meta_dir = os.path.join(path, folder)
            found = _read_entry_points(meta_dir, group)
            if found and (dist := _read_dist(meta_dir, folder)) is not None:
                out += [InstalledEntryPoint(name, value, group, dist) for name, value in found]
    return out


def _read_dist(meta_dir: str, folder: str) -> InstalledDist | None:
    """Name and version from a distribution folder's ``METADATA`` (``PKG-INFO`` for egg-info)."""
    fields: dict[str, str] = {}
    for fname in ("METADATA", "PKG-INFO"):
        try:
            with open(os.path.join(meta_dir, fname), encoding="utf-8", errors="replace") as f:
                for line in f:
                    if not line.strip():
                        break  # the headers end at the first blank line
                    key, sep, value = line.partition(":")
                    if sep and key in ("Name", "Version"):
                        fields.setdefault(key, value.strip())
            break
        except OSError:
            continue
    if "Name" not in fields:
        if not folder.endswith(".dist-info"):
            return None
        stem = folder[: -len(".dist-info")]  # name-version.dist-info
        name, _, version = stem.partition("-")
        fields = {"Name": name, "Version": version}
    return InstalledDist(fields["Name"], fields.get("Version", ""))


def _read_entry_points(meta_dir: str, group: str) -> list[tuple[str, str]]:
    """The ``group`` section of a distribution's ``entry_points.txt`` (an INI file: ``name = value`` lines)."""
    try:
        with open(os.path.join(meta_dir, "entry_points.txt"), encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    out: list[tuple[str, str]] = []
    section = None
    for raw in lines:
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip()
            continue
        if section == group and "=" in line:
            name, _, value = line.partition("=")
            out.append((name.strip(), value.strip()))
    return out
