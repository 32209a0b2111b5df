"""Where a config's plain values come from: the YAML file, read with its checks (``read_yaml``), and
the ``--set`` overrides written into it (``apply_overrides``); and which of the two gave the key a
config error names (``error_source``), with the line of the file that gives it (``key_mark``), or
caused it through another key (``error_cause``).
``nmt.config`` makes the values into typed sections.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from nmt.errors import NMTError


def _contains_itself(node: Any, enclosing: frozenset[int] = frozenset(), acyclic: set[int] | None = None) -> bool:
    """Whether a list or mapping in ``node`` holds itself: a YAML anchor inside itself (a: &x [*x]).
    ``acyclic`` remembers the nodes already walked, so that aliases shared many times cost one walk."""
    acyclic = set() if acyclic is None else acyclic
    if not isinstance(node, (dict, list)) or id(node) in acyclic:
        return False
    if id(node) in enclosing:
        return True
    children = node.values() if isinstance(node, dict) else node
    if any(_contains_itself(child, enclosing | {id(node)}, acyclic) for child in children):
        return True
    acyclic.add(id(node))
    return False


def _first_duplicate_key(root: yaml.Node) -> tuple[str, yaml.Mark] | None:
    """The dotted name and position of a key that repeats one earlier in its mapping, if any.
    A YAML loader keeps the last of them silently; a config must not."""
    pending, seen_nodes = [(root, "")], set()
    while pending:
        node, prefix = pending.pop(0)
        if id(node) in seen_nodes:  # an alias may point back at a node already walked
            continue
        seen_nodes.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            pending.extend((item, prefix) for item in node.value)
        if not isinstance(node, yaml.MappingNode):
            continue
        keys = set()
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue  # a merge key ('<<') may repeat; explicit keys override what it merges
            dotted = f"{prefix}.{key_node.value}" if prefix else key_node.value
            if (key_node.tag, key_node.value) in keys:
                return dotted, key_node.start_mark
            keys.add((key_node.tag, key_node.value))
            pending.append((value_node, dotted))
    return None


class _ValueCheckingLoader(yaml.SafeLoader):
    """PyYAML's safe loader, where a scalar its constructor cannot make into its type is a YAML error
    at that scalar: PyYAML raises a bare ValueError for an impossible date (``name: 2023-02-30``),
    an integer of over 4,300 digits or ``!!int abc``, which names neither the file nor the line."""

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except (ValueError, OverflowError) as e:
            shown = node.value if isinstance(node.value, str) else ""
            shown = shown if len(shown) <= 40 else shown[:37] + "..."
            quote = ": quote it to keep it as text" if node.tag == "tag:yaml.org,2002:timestamp" else ""
            problem = f"cannot read the value {shown!r} ({str(e).split(':')[0]}){quote}"
            raise yaml.constructor.ConstructorError(None, None, problem, node.start_mark) from None


# Numbers YAML 1.1 reads in another base than the decimal a config's writer means: a leading zero
# is octal (seed: 010 is 8) and colons are base 60 (max_minutes: 1:30 is 90). 0x and 0b say their base.
_OCTAL = re.compile(r"[-+]?0[0-7_]+")
_SEXAGESIMAL = re.compile(r"[-+]?[0-9][0-9_]*(:[0-5]?[0-9])+(\.[0-9_]*)?")
_NUMBER_TAGS = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")


def _first_other_base_number(root: yaml.Node, root_key: str) -> tuple[str, yaml.ScalarNode, str] | None:
    """The dotted key (below ``root_key``), node and base of the first number YAML 1.1 reads as octal or
    base 60, if any."""
    pending, seen_nodes = [(root, root_key)], set()
    while pending:
        node, key = pending.pop(0)
        if id(node) in seen_nodes:
            continue
        seen_nodes.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            pending.extend((item, key) for item in node.value)
        elif isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                name = str(key_node.value) if isinstance(key_node, yaml.ScalarNode) else "?"
                pending.append((value_node, f"{key}.{name}" if key else name))
        elif isinstance(node, yaml.ScalarNode) and node.tag in _NUMBER_TAGS and node.style is None:
            if _OCTAL.fullmatch(node.value):
                return key, node, "octal"
            if _SEXAGESIMAL.fullmatch(node.value):
                return key, node, "base 60"
    return None


def _load_unique_keys(path: Path | str, text: str, root_key: str = "") -> Any:
    """``yaml.safe_load(text)``, refusing a key given twice in one mapping, and a number YAML 1.1 would
    read in another base than decimal (``010`` as 8, ``1:30`` as 90). ``root_key``: the key the
    document is the value of (a --set's)."""
    loader = _ValueCheckingLoader(text)
    try:
        root = loader.get_single_node()
        duplicate = None if root is None else _first_duplicate_key(root)
        if duplicate is not None:
            key, mark = duplicate
            raise NMTError(f"{path}: line {mark.line + 1}, column {mark.column + 1}: duplicate key '{key}'")
        other_base = None if root is None else _first_other_base_number(root, root_key)
        if other_base is not None:
            key, node, base = other_base
            mark, read_as = node.start_mark, loader.construct_object(node)
            raise NMTError(
                f"{path}: line {mark.line + 1}, column {mark.column + 1}: config key '{key}': YAML 1.1 reads "
                f"{node.value} as {read_as} ({base}): write the number in decimal, or quote it for text"
            )
        return None if root is None else loader.construct_document(root)
    finally:
        loader.dispose()


def _unshared(node: Any) -> Any:
    """``node`` with a mapping or list of its own wherever it holds one: PyYAML makes an alias
    (``test: *held``) its anchor's own object, and a --set written into one changed both
    (copy.deepcopy would keep them shared)."""
    if isinstance(node, dict):
        return {key: _unshared(value) for key, value in node.items()}
    if isinstance(node, list):
        return [_unshared(value) for value in node]
    return node


def _yaml_error_place(error: yaml.YAMLError, text: str) -> str:
    """' line L, column C:' where the error lies in ``text``, else ''. A character YAML refuses (a
    control character pasted in, invisible in an editor) has only its offset in the text."""
    mark = getattr(error, "problem_mark", None)
    if mark is not None:
        return f" line {mark.line + 1}, column {mark.column + 1}:"
    if isinstance(error, yaml.reader.ReaderError):
        line = text.count("\n", 0, error.position) + 1
        column = error.position - (text.rfind("\n", 0, error.position) + 1) + 1
        return f" line {line}, column {column}:"
    return ""


def read_yaml(path: str | Path) -> dict:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise NMTError(f"{path}: no such config file") from None
    except IsADirectoryError:
        raise NMTError(f"{path}: is a directory, expected a YAML config file") from None
    except PermissionError:
        raise NMTError(f"{path}: permission denied") from None
    except UnicodeDecodeError as e:
        raise NMTError(f"{path}: not valid UTF-8 ({e.reason} at byte {e.start})") from None
    except OSError as e:  # a failing disk or a special file: the read itself failed
        raise NMTError(f"{path}: cannot read the config file ({e.strerror or e})") from None
    try:
        values = _load_unique_keys(path, text)
    except yaml.YAMLError as e:
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise NMTError(f"{path}:{_yaml_error_place(e, text)} YAML does not parse: {problem}") from None
    if values is None:
        raise NMTError(f"{path}: the config file is empty")
    if not isinstance(values, dict):
        raise NMTError(f"{path}: the top level must be a mapping of sections")
    if _contains_itself(values):  # an endless value: no key could hold it, and walking it never ends
        raise NMTError(f"{path}: a YAML alias refers to a value that contains it (recursive anchor)")
    return _unshared(values)


# A '#' at the start or after a space begins a YAML comment, in a --set's value too.
_COMMENT = re.compile(r"(^|\s)#")


def _override_path(text: str) -> list[str]:
    """``train.max_updates=500`` -> ["train", "max_updates"]: the key a --set names, unchecked."""
    return [part.strip() for part in text.partition("=")[0].split(".")]


def parse_override(text: str) -> tuple[list[str], Any]:
    """``train.max_updates=500`` -> (["train", "max_updates"], 500). Values are parsed as YAML; a
    number in scientific notation, a string in YAML 1.1, is read by the key's type (nmt.schema)."""
    _, equals, raw = text.partition("=")
    path = _override_path(text)
    if not equals or not all(path):  # '=5' or '.max_updates=5' would name the key ''
        raise NMTError(f"--set {text!r}: expected section.key=value")
    try:
        # as in a config file, a key twice ('data.train={path: a, path: b}') is an error, not the last one
        value = _load_unique_keys(f"--set {text}", raw, ".".join(path)) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    if _COMMENT.search(raw) and "#" not in str(value):  # a shell argument holds no comment: the '#' was meant
        raise NMTError(f"--set {text}: ' #' starts a YAML comment, which left {value!r}: quote the value")
    return path, value


def _is_corpus(path: list[str]) -> bool:
    return len(path) == 2 and path[0] == "data" and path[1] in ("train", "dev", "test")


def _set_key(path: list[str], value: Any) -> str:
    """The dotted key a --set gives a value: a corpus's string is its path only (see apply_overrides)."""
    return ".".join(path) + (".path" if _is_corpus(path) and isinstance(value, str) else "")


def apply_overrides(values: dict, overrides: list[str]) -> set[str]:
    """Apply ``--set`` overrides to ``values`` in place; returns the dotted keys they set.

    A string for a corpus already given as a mapping replaces its ``path`` only: the mapping's other
    keys (``max_pairs``, ``format``) stay, whether they came from the file or an earlier --set."""
    keys = set()
    for text in overrides:
        path, value = parse_override(text)
        node = values
        for part in path[:-1]:
            child = node.get(part)
            if isinstance(child, str) and part in ("train", "dev", "test"):
                child = {"path": child}
            if not isinstance(child, dict):
                child = {}
            node[part] = child
            node = child
        current = node.get(path[-1])
        if _is_corpus(path) and isinstance(value, str) and isinstance(current, dict):
            node[path[-1]] = {**current, "path": value}
        else:
            node[path[-1]] = value
        keys.add(_set_key(path, value))
    return keys


def file_values_set_into(values: dict, overrides: list[str]) -> list[tuple[str, Any]]:
    """(dotted key, value) of each value of the file that is no mapping and that a --set writes a key
    into (``decode: [1, 2]`` with ``decode.beam_size=5``): apply_overrides makes it a mapping of that
    key alone, so the file's own value would never be checked. One an earlier --set gave is not the file's.
    Only the keys are read: apply_overrides parses the values, and refuses a --set of no key."""
    found, given = [], []
    for text in overrides:
        path = _override_path(text)
        node: Any = values
        for depth, part in enumerate(path[:-1]):
            key = ".".join(path[: depth + 1])
            if any(key == k or key.startswith(k + ".") for k in given) or not isinstance(node, dict):
                break
            node = node.get(part)
            if node is not None and not isinstance(node, dict):
                found.append((key, node))
                break
        given.append(".".join(path))
    return found


# A config error starts by naming its key ("config key 'train.lr_peak': ..."), so the key says where
# the bad value came from: a --set or the file.
_ERROR_KEY = re.compile(r"(?:unknown )?config key '([^']+)'")


# The other keys a check across keys names in its message ("exceeds train.max_updates 30").
_OTHER_KEY = re.compile(r"\b(?:data|tokenizer|model|train|decode)(?:\.[a-z][a-z0-9_]*)+")


def set_giving(key: str, overrides: list[str]) -> str | None:
    """The --set that gives the dotted ``key`` (itself, a section holding it, or a key within it),
    the last such winning as it does for the value; None where none does."""
    for text in reversed(overrides):
        given = _set_key(*parse_override(text))
        if key == given or key.startswith(given + ".") or given.startswith(key + "."):
            return text
    return None


def error_source(message: str, path: Path, overrides: list[str]) -> str:
    """``--set KEY=VALUE`` when the key the error names was given (or lies in a section given) on
    the command line, the last such --set winning as it does for the value; else the file."""
    match = _ERROR_KEY.match(message)
    text = None if match is None else set_giving(match.group(1), overrides)
    return str(path) if text is None else f"--set {text}"


def key_mark(path: Path, key: str) -> yaml.Mark | None:
    """Where the file ``path`` writes the dotted ``key``: its key's mark, or that of the key above it
    whose value is no mapping (a corpus given as its path alone); None where the file leaves it out
    (its default) or cannot be read again. The file is composed a second time, and only for an error,
    so that reading the values stays as it is."""
    try:
        loader = _ValueCheckingLoader(path.read_text(encoding="utf-8-sig"))
    except (OSError, UnicodeDecodeError):
        return None
    try:
        root = loader.get_single_node()
        loader.construct_document(root)  # merges ('<<: *base') into the mappings' nodes, as loading did
    except yaml.YAMLError:
        return None
    finally:
        loader.dispose()
    node, mark = root, None
    for part in key.split("."):
        if not isinstance(node, yaml.MappingNode):
            return mark
        # the last of a key wins, as loading keeps it: an explicit key after the ones a merge gives
        given = [(k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode) and str(k.value) == part]
        if not given:
            return None
        key_node, node = given[-1]
        mark = key_node.start_mark
    return mark


def file_place(message: str, path: Path, overrides: list[str] | None = None) -> str:
    """``path: line L, column C`` of the key the config error ``message`` names, where the file writes
    it (the form of the YAML errors read_yaml reports); where that key is a default, of the first other
    key the message names (a check across keys: 'exceeds train.max_updates 30') that the file gives
    and no --set of ``overrides`` replaces; else the file alone."""
    match = _ERROR_KEY.match(message)
    if match is None:
        return str(path)
    others = [key for key in _OTHER_KEY.findall(message, match.end()) if set_giving(key, overrides or []) is None]
    for key in (match.group(1), *others):
        mark = key_mark(path, key)
        if mark is not None:
            return f"{path}: line {mark.line + 1}, column {mark.column + 1}"
    return str(path)


def error_cause(message: str, path: Path, overrides: list[str], error_with: Callable[[list[str]], str | None]) -> str:
    """Where the config error ``message`` comes from: the --set that gave the key it names
    (``error_source``), else the file and the line of the key there, unless the file alone is free
    of it (``error_with`` gives the check's error with some of the overrides, or None). Then a --set
    caused it through another key (``model.d_model=90`` against the file's 4 heads: the error names
    ``model.heads``): the ones that cause it on their own are named with the file and the line of
    the key there, or every --set where none does alone."""
    source = error_source(message, path, overrides)
    if source != str(path):
        return source
    if not overrides or error_with([]) == message:
        return file_place(message, path, overrides)
    alone = [text for text in overrides if error_with([text]) == message]
    return f"{file_place(message, path, overrides)} with " + ", ".join(f"--set {text}" for text in alone or overrides)
