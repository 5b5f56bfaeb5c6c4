"""Strict loading of typed config sections, and the JSON schema generated from the same declarations.

A section is a frozen dataclass deriving from :class:`_Section`. Each field is declared once with
:func:`knob`: its default, a one-line description, and its allowed values (``choices``, ``ge``/``gt``/``le``/
``lt`` bounds, ``min_items``; on a tuple field the bounds and choices apply to every item, ``min_items`` to the
tuple; ``aliases``: other names accepted for a choice, replaced by the choice when a section is built, so the code
sees only the choices), and a field annotated ``int`` (or a tuple of them) holds integers, never a float (2.0
included) or a bool. The same declaration drives the check in ``__post_init__``, the JSON schema
(:func:`schema_of`: ``enum`` with the aliases, ``minimum``/``exclusiveMinimum``, ``minItems``, ``description``) and
the documentation, so the package and Snakemake's ``validate`` give the same answer. Checks that involve several
fields live in a section's ``check``.

Every refusal is a :class:`ConfigError` of one line that names the key as a dotted path
(``model.ffn.expert_widths[2]=0: must be > 0``).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import numbers
import re
import types
import typing
from dataclasses import MISSING, field
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """The one user-error class: a mistake in a config, a command-line argument or an input file (missing,
    malformed, changed since it was sealed). The message is one line naming the key (a dotted path), argument or
    file and the offending value; ``key`` and ``value`` carry them where the raiser knows them. Every command
    reports it as that line with exit status 2 (mohge.core.cli); any other exception is a bug and keeps its
    traceback."""

    def __init__(self, message: str, key: str | None = None, value: Any = None):
        super().__init__(message)
        self.key, self.value = key, value


def _fail(path: str, value: Any, why: str) -> typing.NoReturn:
    raise ConfigError(f"{path}={value!r}: {why}", key=path, value=value)


# Dataset, family, variant and study names become folder names, file names, Snakemake wildcards and words of
# shell commands: letters, digits, '_' and '-' only, never starting with '-' (no '/', '..', space, '$', '`', ';').
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
# a part of a run name {dataset}-{family}-{variant}-s{seed}: no '-', so the name splits back into its parts
PART_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_]*$")


def check_name(value: Any, key: str, part: bool = False) -> str:
    """``value`` if it is a safe name (see NAME_PATTERN; with ``part``, a run-name part: PART_PATTERN), else a
    ConfigError naming ``key``."""
    if part and isinstance(value, str) and NAME_PATTERN.fullmatch(value) and "-" in value:
        _fail(key, value, "'-' separates the parts of a run name {dataset}-{family}-{variant}-s{seed}: use '_'")
    if not isinstance(value, str) or not NAME_PATTERN.fullmatch(value):
        _fail(key, value, "a name must be letters, digits, '_' or '-', starting with a letter or digit")
    return value


def knob(
    default: Any = MISSING,
    doc: str = "",
    *,
    factory: Any = MISSING,
    choices: tuple | None = None,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    min_items: int | None = None,
    aliases: dict[str, str] | None = None,
) -> Any:
    """A dataclass field with its description and allowed values (checked by ``_Section``, exported to the
    schema); ``aliases`` maps other accepted names to ``choices``."""
    assert not aliases or (choices and set(aliases.values()) <= set(choices)), "an alias names one of the choices"
    meta = {"doc": doc, "choices": choices, "ge": ge, "gt": gt, "le": le, "lt": lt, "min_items": min_items}
    meta["aliases"] = aliases
    meta = {k: v for k, v in meta.items() if v is not None and v != ""}
    if factory is not MISSING:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def _check_value(key: str, value: Any, meta: dict, integer: bool = False) -> None:
    if value is None:
        return
    if integer and (isinstance(value, bool) or not isinstance(value, numbers.Integral)):  # 2.0 is not a count
        _fail(key, value, "expected an integer")
    if "choices" in meta and value not in meta["choices"]:
        _fail(key, value, f"must be one of {tuple(meta['choices'])}")
    bounded = any(b in meta for b in ("ge", "gt", "le", "lt"))
    if bounded and (isinstance(value, bool) or not isinstance(value, numbers.Real)):
        _fail(key, value, "expected a number")
    for bound, ok, word in (
        ("ge", lambda v, b: v >= b, ">="),
        ("gt", lambda v, b: v > b, ">"),
        ("le", lambda v, b: v <= b, "<="),
        ("lt", lambda v, b: v < b, "<"),
    ):
        if bound in meta and not ok(value, meta[bound]):
            _fail(key, value, f"must be {word} {meta[bound]}")


def _options(tp: Any) -> tuple:
    """The types a field annotation allows (``int | None`` -> (int, NoneType))."""
    return typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType) else (tp,)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """``typing.get_type_hints`` of a config class, resolved once per process (a workflow's parse builds thousands of
    sections; callers only read the mapping)."""
    return typing.get_type_hints(cls)


@functools.cache
def _tuple_fields(cls: type) -> frozenset[str]:
    """The fields of a section annotated as a tuple (``tuple[int, ...]``, optional or not)."""
    hints = _hints(cls).items()
    return frozenset(name for name, tp in hints if any(typing.get_origin(a) is tuple for a in _options(tp)))


@functools.cache
def _int_fields(cls: type) -> frozenset[str]:
    """The fields of a section annotated as an integer or a tuple of integers (``int``, ``tuple[int, ...]``,
    optional or not)."""
    hints = _hints(cls).items()
    return frozenset(
        name
        for name, tp in hints
        if any(a is int or (typing.get_origin(a) is tuple and typing.get_args(a)[:1] == (int,)) for a in _options(tp))
    )


class _Section:
    """Mixin: ``from_dict``, the per-field checks declared with :func:`knob`, a ``key()`` helper for messages."""

    _path: str

    @classmethod
    def from_dict(cls, data: dict, path: str = ""):
        return from_dict(cls, data, path)

    def key(self, name: str) -> str:
        return f"{self._path}.{name}" if self._path else name

    def __post_init__(self) -> None:
        tuple_fields, int_fields = _tuple_fields(type(self)), _int_fields(type(self))
        for f in dataclasses.fields(self):
            meta, value = f.metadata, getattr(self, f.name)
            if f.name in tuple_fields and isinstance(value, list):  # a section built in code: lists as tuples
                value = tuple(value)
                object.__setattr__(self, f.name, value)
            integer = f.name in int_fields
            if not meta and not integer:
                continue
            if isinstance(value, str) and value in meta.get("aliases", {}):  # the code sees only the choices
                value = meta["aliases"][value]
                object.__setattr__(self, f.name, value)
            if isinstance(value, tuple):
                if len(value) < meta.get("min_items", 0):
                    _fail(self.key(f.name), value, f"needs at least {meta['min_items']} item(s)")
                for i, item in enumerate(value):
                    _check_value(self.key(f"{f.name}[{i}]"), item, meta, integer)
            else:
                _check_value(self.key(f.name), value, meta, integer)
        self.check()

    def check(self) -> None:
        """Checks across fields (a section overrides it)."""


def _coerce(tp: Any, value: Any, path: str) -> Any:
    """Convert a plain YAML/JSON value to the annotated field type (tuples, nested sections, optionals)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _coerce(args[0], value, path)
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            _fail(path, value, f"expected a mapping for section {tp.__name__}")
        return tp.from_dict(value, path)
    if origin is tuple:
        if not isinstance(value, list | tuple):
            _fail(path, value, "expected a list")
        (item_tp, *_rest) = typing.get_args(tp)
        return tuple(_coerce(item_tp, v, f"{path}[{i}]") for i, v in enumerate(value))
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            _fail(path, value, "expected a mapping")
        return dict(value)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            _fail(path, value, "expected a number")
        try:
            return float(value)
        except ValueError:
            _fail(path, value, "expected a number")
    if tp is int and (isinstance(value, bool) or not isinstance(value, int)):
        _fail(path, value, "expected an integer")
    if tp is bool and not isinstance(value, bool):
        _fail(path, value, "expected true or false")
    if tp is str and not isinstance(value, str):
        _fail(path, value, "expected a string")
    return value


def from_dict(cls: type, data: dict, path: str = "") -> Any:
    """Build dataclass ``cls`` from ``data``; an unknown key is an error naming it and the known keys."""
    if not isinstance(data, dict):
        _fail(path or cls.__name__, data, f"expected a mapping for {cls.__name__}")
    hints = _hints(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    public = sorted(names - {"_path"})
    unknown = sorted(set(data) - set(public))
    if unknown:
        key = f"{path}.{unknown[0]}" if path else unknown[0]
        raise ConfigError(f"{key}: unknown key (known keys of {cls.__name__}: {', '.join(public)})")
    kwargs = {k: _coerce(hints[k], v, f"{path}.{k}" if path else k) for k, v in data.items()}
    try:
        return cls(**kwargs, _path=path) if "_path" in names else cls(**kwargs)
    except TypeError as err:  # a required field without default, or a comparison of the wrong types
        raise ConfigError(f"{path or cls.__name__}: {err}") from err


def to_dict(obj: Any) -> Any:
    """Plain JSON-able view of a config (tuples become lists)."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.name != "_path"}
    if isinstance(obj, tuple | list):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


# ---------------------------------------------------------------- JSON schema from the same declarations

FLOAT_PATTERN = r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$"
_BOUNDS = {"ge": "minimum", "gt": "exclusiveMinimum", "le": "maximum", "lt": "exclusiveMaximum"}


def _constrain(schema: dict, meta: dict) -> dict:
    if "choices" in meta:
        schema = {"enum": [*meta["choices"], *meta.get("aliases", {})]}
    for k, name in _BOUNDS.items():
        if k in meta:
            schema[name] = meta[k]
    return schema


def _aliases_doc(meta: dict) -> str:
    aliases = meta.get("aliases", {})
    return f"; also accepted: {', '.join(f'{a} = {c}' for a, c in aliases.items())}" if aliases else ""


def _doc(cls: type) -> str:
    return " ".join((cls.__doc__ or "").strip().split("\n\n")[0].split())


def schema_of(tp: Any, meta: dict | None = None) -> dict:
    """JSON schema of a type annotation (a section: ``additionalProperties: false``, a description per key)."""
    meta = meta or {}
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = [schema_of(a, meta) for a in typing.get_args(tp) if a is not type(None)]
        return {"anyOf": [*options, {"type": "null"}]}
    if dataclasses.is_dataclass(tp):
        hints = _hints(tp)
        props = {}
        for f in dataclasses.fields(tp):
            if f.init and f.name != "_path":
                props[f.name] = schema_of(hints[f.name], dict(f.metadata))
                if f.metadata.get("doc"):
                    props[f.name]["description"] = f.metadata["doc"] + _aliases_doc(f.metadata)
        return {"type": "object", "additionalProperties": False, "description": _doc(tp), "properties": props}
    if origin is tuple:
        out: dict = {"type": "array", "items": schema_of(typing.get_args(tp)[0], meta)}
        if "min_items" in meta:
            out["minItems"] = meta["min_items"]
        return out
    if tp is dict or origin is dict:
        return {"type": "object"}
    base = {int: {"type": "integer"}, float: {"type": "number"}, bool: {"type": "boolean"}, str: {"type": "string"}}
    out = _constrain(dict(base[tp]), {k: v for k, v in meta.items() if k != "min_items"})
    if tp is float:  # YAML 1.1 reads 1e-3 (no dot) as a string; the loader converts it, so the schema allows it
        return {"anyOf": [out, {"type": "string", "pattern": FLOAT_PATTERN}]}
    return out


# ---------------------------------------------------------------- files, read within bounds

# A config is a few kB; these bounds refuse a hostile or mistaken file before it is expanded (docs/errors.md).
MAX_CONFIG_BYTES = 1 << 20  # 1 MiB: configs/paper.yaml is 4 kB
MAX_JSON_BYTES = 256 << 20  # a manifest (meta.json of many shards, a checkpoint's data.json): 256 MiB
MAX_DEPTH = 64  # mappings and lists nested at most this deep (configs nest 4 levels)
MAX_NODES = 200_000  # YAML nodes after every alias is expanded (a 515-byte alias bomb expands to billions)


@functools.cache
def _bounded_loader() -> type:
    """The loader class, built on first use: yaml is imported only when a YAML file is read, so building a config
    in code (the GPU checks on a bare box) needs no pyyaml."""
    import yaml

    class _BoundedLoader(yaml.SafeLoader):
        """SafeLoader that counts, while composing, the depth and the expanded size of every node (an alias
        counts as the whole node it names, so nested aliases multiply) and refuses duplicate keys."""

        def __init__(self, stream: str, where: str):
            super().__init__(stream)
            self.where, self.depth, self.nodes = where, 0, 0
            self.sizes: dict[int, int] = {}  # id(node) -> expanded node count

        def _refuse(self, mark: Any, why: str) -> typing.NoReturn:
            at = f"{self.where}:{mark.line + 1}:{mark.column + 1}" if mark is not None else self.where
            raise ConfigError(f"{at}: {why}")

        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                mark = self.peek_event().start_mark
                node = super().compose_node(parent, index)
                if id(node) not in self.sizes:  # the alias names a node still being composed
                    self._refuse(mark, "a recursive alias (a value that contains itself)")
                self._count(self.sizes[id(node)], mark)
                return node
            mark = self.peek_event().start_mark
            self.depth += 1
            if self.depth > MAX_DEPTH:
                self._refuse(mark, f"nested deeper than {MAX_DEPTH} levels")
            before = self.nodes
            node = super().compose_node(parent, index)
            self.depth -= 1
            self._count(1, mark)
            self.sizes[id(node)] = self.nodes - before
            return node

        def _count(self, n: int, mark: Any) -> None:
            self.nodes += n
            if self.nodes > MAX_NODES:
                self._refuse(mark, f"more than {MAX_NODES} values once its aliases are expanded (an alias bomb?)")

        def construct_mapping(self, node: Any, deep: bool = False) -> dict:
            if isinstance(node, yaml.MappingNode):
                seen: dict[Any, Any] = {}
                for key_node, _ in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge":
                        continue
                    key = self.construct_object(key_node, deep=True)
                    try:
                        first = seen.setdefault(key, key_node.start_mark)
                    except TypeError:  # an unhashable key: the base class names it
                        continue
                    if first is not key_node.start_mark:
                        self._refuse(key_node.start_mark, f"duplicate key {key!r} (first at line {first.line + 1})")
            return super().construct_mapping(node, deep)

    return _BoundedLoader


def check_bounds(data: Any, where: str = "config", max_nodes: int | None = MAX_NODES) -> None:
    """Refuse a parsed value nested deeper than MAX_DEPTH or holding more than MAX_NODES values once shared
    parts are counted as often as they occur (what a YAML alias given on Snakemake's ``--config`` would expand
    to). Iterative, with an early exit: a hostile value costs at most MAX_NODES steps."""
    stack, nodes = [(data, 1)], 0
    while stack:
        obj, depth = stack.pop()
        nodes += 1
        if max_nodes is not None and nodes > max_nodes:
            raise ConfigError(f"{where}: more than {max_nodes} values once its aliases are expanded (an alias bomb?)")
        if isinstance(obj, dict | list | tuple):
            if depth > MAX_DEPTH:
                raise ConfigError(f"{where}: nested deeper than {MAX_DEPTH} levels")
            stack.extend((v, depth + 1) for v in (obj.values() if isinstance(obj, dict) else obj))


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict:
    out: dict = {}
    for k, v in pairs:
        if k in out:
            raise ConfigError(f"duplicate key {k!r}")
        out[k] = v
    return out


def read_bounded_text(path: str | Path, what: str = "config file", max_bytes: int = MAX_CONFIG_BYTES) -> str:
    """The UTF-8 text of ``path``, refused (naming it) when missing, larger than ``max_bytes`` or not UTF-8."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{what} {str(p)!r} does not exist", key=str(p))
    size = p.stat().st_size
    if size > max_bytes:
        raise ConfigError(f"{p}: {size} bytes, more than the {max_bytes} a {what} may hold")
    with open(p, "rb") as fh:
        raw = fh.read(max_bytes + 1)
    if len(raw) > max_bytes:  # grew while being read
        raise ConfigError(f"{p}: more than the {max_bytes} bytes a {what} may hold")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"{what} {str(p)!r} is not UTF-8 text (byte {err.start})") from err


def parse_json(text: str, where: str, max_nodes: int | None = MAX_NODES) -> Any:
    """JSON text parsed with duplicate keys, deep nesting and (``max_nodes``) more values refused, each error one
    line naming ``where``."""
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as err:
        raise ConfigError(f"{where}:{err.lineno}:{err.colno}: not valid JSON: {err.msg}") from err
    except RecursionError as err:
        raise ConfigError(f"{where}: nested deeper than {MAX_DEPTH} levels") from err
    except ConfigError as err:
        raise ConfigError(f"{where}: {err}") from err
    check_bounds(data, where, max_nodes)
    return data


def parse_yaml(text: str, where: str) -> Any:
    """YAML text parsed by the bounded loader (:func:`_bounded_loader`: depth, expanded size, duplicate keys),
    errors naming ``where``."""
    import yaml

    loader = _bounded_loader()(text, where)
    try:
        return loader.get_single_data()
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f"{where}:{mark.line + 1}:{mark.column + 1}" if mark is not None else where
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(f"{at}: not valid YAML: {problem}") from err
    except RecursionError as err:
        raise ConfigError(f"{where}: nested deeper than {MAX_DEPTH} levels") from err
    finally:
        loader.dispose()


def load_json_file(path: str | Path, what: str = "manifest", max_bytes: int = MAX_JSON_BYTES) -> Any:
    """A JSON file the package wrote (meta.json, manifest.json, data.json, config.json), read within bounds:
    truncated, malformed, too large or too deep is a ConfigError naming the file."""
    return parse_json(read_bounded_text(path, what, max_bytes), str(path), max_nodes=None)  # size bounds it


def load_yaml_or_json(path: str | Path) -> dict:
    """Read a YAML or JSON mapping within bounds (size, depth, expanded aliases; duplicate keys refused); a
    missing or malformed file is an error naming it (and line and column)."""
    p = Path(path)
    text = read_bounded_text(p)
    data = parse_json(text, str(p)) if p.suffix == ".json" else parse_yaml(text, str(p))
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(p)!r} must hold a mapping, got {type(data).__name__}")
    return data
