"""Writing generated files: render a template, then write a set of files all or nothing."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from currytrain.errors import ConfigError


def render(template: str, **values: str) -> str:
    """The text of templates/<template> with each {{key}} replaced by its value."""
    text = resources.files("currytrain.project").joinpath("templates", template).read_text()
    for key, value in values.items():
        text = text.replace("{{" + key + "}}", value)
    return text


def write_files(root: Path, files: dict[str, str], *, force: bool = False) -> list[Path]:
    """Write each relative path -> text under root; returns the paths written.

    Every path is checked before anything is written, so a refusal leaves the disk as it was: an existing
    file is refused unless force (then it is replaced), a path whose parent is a file is always refused.
    """
    targets = {root / relative: text for relative, text in files.items()}
    existing = sorted(str(path.relative_to(root)) for path in targets if path.exists())
    if existing and not force:
        raise ConfigError(f"{root} already has {', '.join(existing)}: nothing was written; pass --force to replace them")
    for path in targets:
        blocked = next((parent for parent in path.parents if parent.is_file()), None)
        if blocked is not None:
            raise ConfigError(f"{blocked} is a file, so {path} cannot be written: nothing was written; move it away")
    for path, text in targets.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return list(targets)
