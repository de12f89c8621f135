"""Reading a user's YAML (or JSON) file of options, safely: a size limit (so that ``/dev/zero`` or a huge file
is refused, not read into memory), no aliases (a "billion laughs" file of nested aliases would expand without
end) and no key given twice (YAML would silently keep the last value)."""

from __future__ import annotations

from pathlib import Path

import yaml

MAX_BYTES = 1 << 20  # a config or search space is a few hundred bytes; 1 MiB is far beyond any real one


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing aliases and duplicate keys."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.events.AliasEvent):
            mark = self.peek_event().start_mark
            raise yaml.composer.ComposerError(None, None, "uses an alias (*name); write each value out", mark)
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"sets {key!r} twice; keep one",
                                                        key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def read_yaml_file(path: str | Path, what: str = "config file"):
    """The value a YAML file holds; a ValueError naming ``path`` (and the line) for a file that cannot be read,
    is larger than 1 MiB, is not YAML, or uses an alias or a key twice."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as e:
        raise ValueError(f"cannot read the {what} {path}: {e.strerror}") from e
    if len(data) > MAX_BYTES:
        raise ValueError(f"the {what} {path} is larger than {MAX_BYTES >> 20} MiB; it is not a file of options")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"the {what} {path} is not UTF-8 text (byte {e.start})") from e
    try:
        return yaml.load(text, Loader=_StrictLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ValueError(f"{path} is not valid YAML (a {what}): {problem}"
                         + (f" (line {mark.line + 1})" if mark is not None else "")) from e


__all__ = ["MAX_BYTES", "read_yaml_file"]
