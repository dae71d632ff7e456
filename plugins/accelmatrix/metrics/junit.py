"""JUnit XML: test results as counts and failure names, never a grepped "OK".

pytest (``--junitxml``), ruff (``--output-format junit``), unittest runners, Java and Go test
tools all write this format, so one parser serves every tier of a CI suite. Used twice: the
``junit_xml`` metric source turns the files into metrics (``tests_passed``, ``tests_failed``,
``tests_errored``, ``tests_skipped``, ``tests_total``, ``tests_seconds``), and the ``junit``
check reads the failure names to say which tests failed.

Safety: the files come from the workload, so a document type declaration (the vehicle of
entity-expansion bombs) is refused and files above ``MAX_BYTES`` are not parsed.
Import-light: only the standard library and pydantic.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_BYTES = 50 * 1024 * 1024
PREFIX_RE = r"^[A-Za-z0-9_./:-]*$"
COUNTS = ("passed", "failed", "errored", "skipped")


class JunitError(ValueError):
    """A JUnit file cannot be read or is not JUnit XML."""


@dataclass(frozen=True)
class FailedTest:
    """One failing or erroring test case, as a reader wants to see it."""

    id: str  # classname::name
    kind: Literal["failure", "error"]
    message: str  # first line of the failure message

    def __str__(self) -> str:
        return f"{self.id} ({self.kind}: {self.message})" if self.message else self.id


@dataclass
class JunitResult:
    """Counts and failures over one or several JUnit files."""

    passed: int = 0
    failed: int = 0
    errored: int = 0
    skipped: int = 0
    seconds: float = 0.0
    failures: list[FailedTest] = field(default_factory=list)
    files: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return self.passed + self.failed + self.errored + self.skipped

    def add(self, other: JunitResult) -> None:
        for name in COUNTS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.seconds += other.seconds
        self.failures.extend(other.failures)
        self.files.extend(other.files)


def _first_line(text: str | None) -> str:
    for line in (text or "").splitlines():
        if line.strip():
            return line.strip()[:300]
    return ""


def parse_junit(path: Path) -> JunitResult:
    """Count the test cases of one JUnit XML file; raises JunitError when unreadable."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_BYTES:
            raise JunitError(f"{path}: {size} bytes is more than the {MAX_BYTES} read")
        raw = path.read_bytes()
    except OSError as e:
        raise JunitError(f"{path}: cannot read: {e}") from None
    if b"<!DOCTYPE" in raw or b"<!ENTITY" in raw:
        raise JunitError(f"{path}: document type declarations are refused in JUnit XML")
    try:
        root = ET.fromstring(raw)  # noqa: S314 - no DTD possible, size capped (see above)
    except ET.ParseError as e:
        raise JunitError(f"{path}: malformed XML: {e}") from None
    if root.tag not in ("testsuites", "testsuite"):
        raise JunitError(f"{path}: not JUnit XML (root element <{root.tag}>)")
    out = JunitResult(files=[str(path)])
    for case in root.iter("testcase"):
        ident = f"{case.get('classname') or ''}::{case.get('name') or '?'}".lstrip(":")
        try:
            out.seconds += float(case.get("time") or 0.0)
        except ValueError:
            pass
        bad = case.find("failure")
        kind: Literal["failure", "error"] = "failure"
        if bad is None:
            bad, kind = case.find("error"), "error"
        if bad is not None:
            message = _first_line(bad.get("message")) or _first_line(bad.text)
            out.failures.append(FailedTest(ident, kind, message))
            if kind == "failure":
                out.failed += 1
            else:
                out.errored += 1
        elif case.find("skipped") is not None:
            out.skipped += 1
        else:
            out.passed += 1
    return out


def matching_files(files_dir: Path, glob: str) -> list[Path]:
    """Regular files under ``files_dir`` matching ``glob`` that do not escape it (symlinks)."""
    if not files_dir.is_dir():
        return []
    root = files_dir.resolve()
    return sorted(
        p for p in files_dir.glob(glob) if p.is_file() and p.resolve().is_relative_to(root)
    )


def parse_junit_glob(files_dir: Path, glob: str) -> tuple[JunitResult, list[str]]:
    """Every JUnit file matching ``glob``, summed; plus one problem text per unreadable file."""
    total, problems = JunitResult(), []
    for path in matching_files(Path(files_dir), glob):
        try:
            total.add(parse_junit(path))
        except JunitError as e:
            problems.append(str(e))
    return total, problems


class JunitXmlSource(BaseModel):
    """``{type: junit_xml, glob: "out/junit-*.xml", prefix: unit_}`` in ``workload.metrics``.

    Scalars ``<prefix>tests_passed|failed|errored|skipped|total`` and ``tests_seconds``
    summed over every matching file. No matching file gives no metrics and a diagnostic,
    so a ``junit`` or ``metric_between`` check on them fails as missing.
    """

    model_config = ConfigDict(extra="forbid")

    type: Literal["junit_xml"]
    glob: str = Field(description="files relative to the collected files dir")
    prefix: str = Field("", pattern=PREFIX_RE)

    @field_validator("glob")
    @classmethod
    def _relative(cls, v: str) -> str:
        for part in v.split("/"):
            if "**" in part and part != "**":
                raise ValueError(f"glob {v!r}: '**' must be a whole path component")
        if v.startswith(("/", "\\", "~")) or ".." in re.split(r"[/\\]", v) or not v.strip():
            raise ValueError(
                f"glob {v!r} must be a non-empty path relative to the collected files dir, "
                "without '..'"
            )
        return v

    @property
    def label(self) -> str:
        return f"junit_xml:{self.glob}"

    def collect(self, files_dir: Path, sink: Any) -> None:
        """Emit the counts through a metrics ``_Sink`` (see metrics.sources)."""
        if not matching_files(Path(files_dir), self.glob):
            sink.problem(f"no file matches {self.glob!r} in {files_dir}")
            return
        result, problems = parse_junit_glob(Path(files_dir), self.glob)
        for p in problems:
            sink.problem(p)
        if not result.files:
            return
        for name in COUNTS:
            sink.row(f"{self.prefix}tests_{name}", float(getattr(result, name)), None, None)
        sink.row(f"{self.prefix}tests_total", float(result.total), None, None)
        sink.row(f"{self.prefix}tests_seconds", result.seconds, None, "s")
