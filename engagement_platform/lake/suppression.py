"""The suppression list of erased subjects: what keeps an erased person erased (no Spark, no Dagster).

An erasure records its subject as a keyed hash, never in clear: HMAC-SHA256 under the deployment's
secret (EP_ERASURE_SECRET) of "<scope>\\x1f<subject id>", the scope being the org (engagement lake) or the
tenant (profile lake), so the same id in another org is another person. Without the secret a hash cannot
be tested against guessed ids; with it, every writer can test the ids it is about to store.

Every stream that stores records of a lake checks them against its lake's list before writing: a record
naming a suppressed subject of its scope is dropped, counted per batch (the `suppressed_records` table,
with the hash) and stored nowhere, quarantine included. What "naming" means:

- an id field (engagement_activity's lead_id / contact_id, a profile's identity) whose hash is suppressed;
- raw content (a quarantined record's bytes, a request's JSON): a whole token of letters, digits and
  underscores, a whole JSON string value, or a piece between separators (whitespace, quotes, brackets,
  , : ; = & | < >), in the text and in its JSON-unescaped form, whose hash is suppressed. A record too
  broken to have an org is tested against every scope.

Only scopes that have suppressed subjects cost anything: the others are never hashed.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

SEPARATOR = "\x1f"
_TOKEN = re.compile(r"[A-Za-z0-9_]+")
_JSON_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"')
# What separates values in JSON, CSV, query strings and free text: an id never contains these, so the
# pieces between them are candidates too (a malformed record's misplaced quote cannot hide an id).
_SEPARATORS = re.compile(r"[\s\"'{}\[\](),:;=&|<>]+")


def subject_hash(secret: bytes, scope: str, subject_id: str) -> str:
    """The keyed hash an erasure records for `subject_id` in `scope` (hex)."""
    return hmac.digest(secret, f"{scope}{SEPARATOR}{subject_id}".encode(), "sha256").hex()


def candidate_ids(content: str | bytes | None) -> set[str]:
    """What in raw content could be a subject id: its whole alphanumeric tokens and whole JSON string values."""
    if content is None:
        return set()
    if isinstance(content, (bytes, bytearray, memoryview)):
        content = bytes(content).decode("utf-8", errors="replace")
    texts = [content]
    if "\\u" in content:  # JSON escapes (\u002d for "-"): the decoded text is searched too
        try:
            texts.append(content.encode("utf-8", errors="replace").decode("unicode_escape"))
        except UnicodeDecodeError:
            pass
    found: set[str] = set()
    for text in texts:
        found |= set(_TOKEN.findall(text)) | {v for v in _JSON_STRING.findall(text) if v} | set(_SEPARATORS.split(text))
    found.discard("")
    return found


@dataclass(frozen=True)
class Suppressed:
    """The suppressed subjects of some scopes (scope -> hashes) and the secret to test ids with. Picklable:
    the driver ships it to the Spark tasks that filter records."""

    secret: bytes
    by_scope: dict[str, frozenset[str]] = field(default_factory=dict)

    @staticmethod
    def of(secret: bytes, pairs: Iterable[tuple[str, str]]) -> Suppressed:
        """From (scope, subject hash) pairs."""
        grouped: dict[str, set[str]] = {}
        for scope, digest in pairs:
            grouped.setdefault(scope, set()).add(digest)
        return Suppressed(secret, {s: frozenset(h) for s, h in grouped.items()})

    @staticmethod
    def of_subjects(secret: bytes, subjects: Iterable[tuple[str, str]]) -> Suppressed:
        """From (scope, subject id) pairs: what an erasure batch adds."""
        return Suppressed.of(secret, ((scope, subject_hash(secret, scope, sid)) for scope, sid in subjects))

    def __bool__(self) -> bool:
        return bool(self.by_scope)

    @property
    def scopes(self) -> list[str]:
        return sorted(self.by_scope)

    def pairs(self) -> set[tuple[str, str]]:
        return {(scope, h) for scope, hashes in self.by_scope.items() for h in hashes}

    def hit(self, scope: str | None, ids: Iterable[str | None]) -> str | None:
        """The suppressed hash among `ids` (id field values) in `scope`, or None."""
        if scope is None:
            return None
        hashes = self.by_scope.get(scope)
        if not hashes:
            return None
        for value in ids:
            if value:
                digest = subject_hash(self.secret, scope, value)
                if digest in hashes:
                    return digest
        return None

    def content_hit(self, scope: str | None, texts: Iterable[str | bytes | None]) -> tuple[str, str] | None:
        """(scope, hash) of a suppressed subject that raw content names, or None. Content without a scope is
        tested against every scope."""
        scopes = [scope] if scope is not None else self.scopes
        scopes = [s for s in scopes if s in self.by_scope]
        if not scopes:
            return None
        candidates = set()
        for text in texts:
            candidates |= candidate_ids(text)
        for s in scopes:
            found = self.hit(s, sorted(candidates))
            if found:
                return s, found
        return None
