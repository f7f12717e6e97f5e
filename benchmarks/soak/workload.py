"""The soak's workload: deterministic for a seed, generated round by round (the runner, __main__.py, sends it).

Covers (defaults, per round): activities of 3 orgs on leads and contacts; bad activities of five kinds (cut
JSON, no activity_type, a non-integer duration, an unknown activity type, oversized); producer retries (the
same bytes twice); ID mutation requests (convert, sometimes date-bounded; merge of two contacts; delete of an
owner or of one engagement; update of one engagement) with chains (a contact a convert made is merged or
deleted later), requests whose target activity comes 8-25 rounds later (late targets), retried requests and bad
requests of five kinds; every 40 rounds a lead who is erased (activities before and after the request, and a
namesake in another org who stays); bad GDPR requests of four kinds; profile CDC of 3 tenants: partial upserts
with explicit nulls, links (related_ids), deletes, late changes (a lower sequence 3-15 rounds after a higher
one) and bad records of four kinds; every 15 rounds a CSV export for the shipped `rewards_members` landing
pipeline (Workload.landing, landed by the runner): 27-32 good rows (both date formats, every level key, an empty
level, one-word and three-word names) and 2-3 bad lines of six kinds (a line that does not parse, a date or points
that do not convert, a bad email, no email, four validation errors at once), member ids unique in the soak; TTL
retention: in about a third of the rounds an old activity (dated 2.5 years before the others, on owner ids of its
own, now and then a producer retry), and every 60 rounds (at 45, 105, ...: never a round with an erasure or bad GDPR
request) a retention request of one org in turn, sometimes retried, whose cut-off deletes that org's old activities of
earlier rounds and leaves those of later rounds (one may be dated the cut-off day itself: kept); profile erasure
(Workload._profile_erasure): every 40 rounds (at 35, 75, 115, ...: never the round of an engagement erasure (5 mod 40),
a bad GDPR request (10 mod 20), a landing file (14 mod 15) or a retention request (45 mod 60), and its rounds k..k+7 hold
none of the first, second and fourth) a profile of one tenant in turn erased on EP_PROFILE_ERASURE_TOPIC, the three cases the README pins in turn: a subject linked (related_ids) to
a second id with changes of its own (both go: the merged identity), one alone whose last change is a delete (the
tombstone goes), and an id no change ever named (still suppressed); before the request a bad change naming the subject
(quarantined, then deleted by the erasure), with it sometimes a producer retry (refused as repeated, naming an erased
id: suppressed) and a bad request of four kinds in turn (malformed, no subject_id, a tenant off the pattern, a
request_time that is no timestamp); after it changes of every erased id, of a new id linking itself to the subject,
and a bad change naming it (the dumper drops them all, counted in profile_suppressed_records), and the subject's
namesake (the same id) in the next tenant before and after (kept).

Left out, because their outcome depends on timing the oracle cannot observe: a retention cut-off among dates still
arriving (it deletes what happens to be ingested), mutations of rows a cut-off deletes, repeated erasures (kept in
quarantine or not depending on the suppression commit's timing), mutations naming an erased subject (applied before
the erasure, dropped after), late profile deletes and late changes setting keys their newer change does not (the
raw row keeps no per-key sequence), profile erasures of ids that other changes link to or whose links a later change
replaces (the identity would be what the processor happened to merge: the oracle reports it), profile erasure requests
naming an erased id other than a producer retry (purged from quarantine or suppressed depending on the batching), the
rows_removed of profile_erasure_audit (raw rows or staged rows, depending on what the processor merged before the
erasure), backfill. Landing lines keep to kinds whose outcome the README and test_apply.py pin: none that only the details of Spark's CSV parser decide (embedded newlines, stray quotes,
spaces around values), and no pipeline with a `suppression:` section (rewards_members has none).

What keeps the rest exact although batching is not deterministic:
- a request touches only ids and engagements whose activities all came in earlier rounds, and no later activity
  names an id a request touched (the id leaves the pool activities draw from);
- each mutation message of round k is gated: sent once the ingestion stream committed every activity of rounds
  < k, so what a request needs is in the table when its batch is planned;
- an erased subject's activities after the erasure request wait until the retention stream committed it (the
  suppression list then drops them), and no request names the subject;
- a late target is one activity no other request touches: whether its request applies late or expires changes
  nothing else (the oracle takes the requests that actually expired as an input);
- TTL retention (Workload._retention): old activities are dated by epoch (how many retention requests came so far,
  in this round or before), OLD_STEP_DAYS days per epoch (a random day within it); a request's cut-off is the first
  day of the epoch it opens. So the old activities of rounds before the request are all dated before the cut-off,
  those of its round and later on or after it, and every other activity (and every date a mutation request sets)
  is in January 2026, after every cut-off. The request is gated like a mutation message: what it must delete is in
  the table when its batch commits (the delete runs at commit, under the table's lock), and what it must keep is
  kept whenever it arrives. Old activities name ids of their own, out of the pools and the generator's rows
  (self.rows) that requests and erasures draw from: no other request touches them. Requests of one org are 180
  rounds apart and keyed by it (one partition, sent in order), so each deletes, and gdpr_audit counts for it,
  exactly its org's old activities of the rounds since the one before;
- a landing file is complete when it appears (written under a dot-name, then moved in) and is read whole by one
  batch (with the other files waiting then): its rows and errors depend on its bytes alone, and no member id is in two files, so the order and timing
  of the batches change nothing;
- profile erasure (Workload._profile_erasure): its ids are its own ("E" ids, out of the p1..p40 that the other profile
  changes and their links draw from), so nothing else names or links them. The request is gated on the dumper having
  staged every change of the rounds before it (Gate(PROFILE_CDC, PROFILES, k+2)): the erasure batch, planned after the
  request was produced, reads the identity from the raw table (merged changes: each id's newest links) and the staged,
  unmerged changes (all their links) at versions pinned inside the tenant's lock, and since no link of its ids is ever
  replaced both give the same component, whatever the processor merged: ids_erased is exact. Their rows go from raw or
  staging (whichever holds them; the tenant lock orders the erasure and the processor's runs), and a processor run
  planned before the erasure but merging after it loads the suppression list inside the lock and drops them (the
  README's backstop), so none is stored; the bad change before it is in the quarantine by then and is deleted from it.
  Every later message naming an erased id is gated on the erasure stream having committed the request (`queued`: also
  while the request still waits for its own gate), so the dumper batch that reads it was planned, and loads the
  suppression list, after the list's commit: it is dropped and counted once (its batch's txn), never staged. A
  producer retry of the request is refused as repeated in its batch or a later one (profile_erasure_audit holds the
  first), and either way it names an erased id: suppressed, never quarantined. The namesake is another tenant's person
  (hashes are per tenant).

Landing files, old activities and retention requests, and profile erasures draw from their own random streams and
counters: the other Kafka messages of a seed are those it gave before they were added (the retention and profile
erasure messages come last in their round, so only the send indices of the rest move). Profile erasure's CDC changes
have a sequence of their own: per id it grows, which is all the fold needs.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

ACTIVITIES, MUTATIONS, GDPR, PROFILES = "activities", "mutations", "gdpr", "profiles"  # logical topics
PROFILE_ERASURES = "profile_erasures"  # logical topic of profile erasure requests (EP_PROFILE_ERASURE_TOPIC)
INGESTION, RETENTION = "ingestion", "retention"  # the streams a gate waits for
PROFILE_CDC, PROFILE_ERASURE = "profile_cdc", "profile_erasure"  # the CDC dumper's and the profile erasure's streams
ORGS = ("00DSOAK000001", "00DSOAK000002", "00DSOAK000003")
TENANTS = ("acme", "globex", "initech")
ACTIVITY_TYPES = ("email_sent", "email_opened", "email_replied", "call", "meeting", "video_viewed", "task_completed")
# Request and CDC clocks are synthetic and in the past: request_time more than a day after the batch is refused.
BASE_TIME = datetime(2026, 1, 5, 8, tzinfo=UTC)
FIRST_DAY = date(2026, 1, 1)
DROP = object()  # in a spoiler: remove the key
# Bad records: kind -> how a good record is spoiled (malformed_record: its JSON cut short by 7 bytes). The kind is
# the error code the stream's validation gives it; each record has exactly one.
BAD_ACTIVITIES = {
    "malformed_record": {},
    "missing_required": {"activity_type": DROP},
    "wrong_type": {"duration_seconds": "long"},
    "not_in_enum": {"activity_type": "fax_sent"},
    "oversized": {"payload": {"body": "x" * 70_000}},
}
BAD_REQUESTS = {
    "malformed_record": {},
    "not_in_enum": {"op": "rename"},
    "missing_required": {"to_id": DROP},
    "invalid_date_range": {"date_from": "2026-01-20", "date_to": "2026-01-10"},
    "wrong_type": {
        "op": "merge",
        "field": "contact_id",
        "from_ids": "003NOTALIST",
        "from_field": DROP,
        "from_id": DROP,
        "to_field": DROP,
    },
}
BAD_GDPR = {
    "malformed_record": {},
    "not_in_enum": {"kind": "forget"},
    "missing_required": {"subject_id": DROP},
    "request_time_in_future": {"request_time": "2099-01-01T00:00:00Z"},
}
BAD_PROFILES = {
    "malformed_record": {},
    "not_in_enum": {"op": "merge"},
    "invalid_json": {"fields": "[1, 2]"},
    "missing_required": {"primary_id": DROP},
}
# Bad profile erasure requests (profiles/erasure/pipeline.yaml): each names ids no CDC change uses, so none is erased
BAD_PROFILE_ERASURES = {
    "malformed_record": {},
    "missing_required": {"subject_id": DROP},
    "pattern_mismatch": {"tenant": "Acme Corp"},
    "wrong_type": {"request_time": "soon"},
}
# Profile erasure cases, in turn (Workload._profile_erasure): a subject linked to a second id, one alone whose last
# change before the request deletes it (a tombstone), and an id no change ever named.
PROFILE_ERASURE_KINDS = ("linked", "alone", "nowhere")
# The shipped landing pipeline (pipelines/rewards_members.yaml) the soak lands CSV exports for: its name, its folder
# under EP_LANDING_ROOT and, in the oracle's and reconcile's dicts, its key next to the logical topics.
LANDING = "rewards_members"
MEMBER_COLUMNS = ("id", "name", "bday", "level", "email", "points")  # the CSV's columns, in the header's order
# The name splits on its first space (the rest goes to the last name): "Mary Ann de Vries" is Mary / Ann de Vries.
FIRST_NAMES = ("Ann", "Bob", "Chloe", "Dev", "Eve", "Gus", "Ines", "Jo", "Kai", "Mary Ann")
LAST_NAMES = ("Lee", "Ray", "Ng", "O'Neil", "de Vries", "Smith")
LEVELS = ("B", "S", "G", "bronze", "silver", "gold", "")  # every mapping key; empty: a null level, no error
# Bad lines: (the "+"-joined error codes the pipeline gives the line, how a good row is changed); None: the line
# does not parse (an unclosed quote: two fields). The kinds and their codes are those test_apply.py's LINES pin.
BAD_MEMBERS = (
    ("malformed_record", None),
    ("wrong_type", {"bday": "13/45/1990"}),
    ("wrong_type", {"points": "many"}),
    ("pattern_mismatch", {"email": "fay-at-example"}),
    ("missing_required", {"email": ""}),
    (
        "missing_required+out_of_range+pattern_mismatch",
        {"name": "J0hn Doe", "bday": "1800-01-01", "email": "", "points": "-5"},
    ),
)
# TTL retention (Workload._retention): old activities from OLD_FIRST_DAY on, OLD_STEP_DAYS days per epoch. About 2.5
# years before FIRST_DAY: far from every other date, yet a few hundred (org, day, type) keys in engagement_daily_metrics
# at most, and retention_days (1..36500) stays under 1000. The epochs run out before FIRST_DAY after 457 of them
# (round 27,405, over 15 hours at 2 s a round): from then on the workload makes no old activity and no retention request.
OLD_FIRST_DAY = date(2023, 7, 1)
OLD_STEP_DAYS = 2
OWNERS = ("lead_id", "contact_id", "account_id", "user_id")
OPS = ("convert", "merge", "delete_owner", "delete_engagement", "update", "late")
OP_WEIGHTS = (30, 15, 10, 10, 15, 20)


@dataclass(frozen=True)
class Gate:  # send only once `stream` has committed every message of `topic` produced in rounds <= `round`
    stream: str
    topic: str
    round: int
    # and (if set) none of those rounds' messages of `topic` still waits for its own gate: a later change of an erased
    # profile must follow its erasure request, itself gated (on the dumper), not only what was produced so far
    queued: bool = False


@dataclass(frozen=True)
class Message:
    index: int  # send order
    round: int
    topic: str  # logical topic
    key: bytes
    value: bytes
    intent: str  # what the generator meant (tests and diagnostics only: the oracle derives outcomes itself)
    gate: Gate | None = None


@dataclass(frozen=True)
class LandingFile:  # a CSV export the runner lands in its round under EP_LANDING_ROOT/<LANDING>/
    round: int
    name: str
    data: bytes
    intents: tuple[str, ...]  # per line after the header: "good" or "bad:<error codes>" (tests and diagnostics only)


def dumps(record: dict) -> bytes:
    return json.dumps(record, separators=(",", ":")).encode()


def iso(t: datetime) -> str:
    return t.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class Workload:
    def __init__(
        self,
        seed: int = 7,
        activities_per_round: int = 6,
        requests_per_round: float = 1.5,
        profile_changes_per_round: int = 4,
        erasure_every: int = 40,
        landing_every: int = 15,
        retention_every: int = 60,
        profile_erasure_every: int = 40,
    ):
        self.rng, self.seed = random.Random(seed), seed
        self.activities_per_round, self.requests_per_round = activities_per_round, requests_per_round
        self.profile_changes_per_round, self.erasure_every = profile_changes_per_round, erasure_every
        self.landing_every = landing_every  # 0: no landing files
        self.landing_rng = random.Random(f"landing/{seed}")  # its own stream: self.rng's draws stay as they were
        self.landing: list[LandingFile] = []
        self.member = 0  # the last member id: ids are unique in the soak
        self.retention_every = retention_every  # 0: no old activities and no retention requests
        self.retention_rng = random.Random(f"retention/{seed}")  # its own stream, like landing_rng
        self.retention_counter = 0  # its own ids ("T" where the others have "N"): the other ids stay as they were
        self.old: dict[str, dict] = {}  # engagement id -> {org_id, round, engagement_date} of each old activity
        self.old_owners = {(org, f): [] for org in ORGS for f in ("lead_id", "contact_id")}  # ids old activities name
        self.cutoffs: list[tuple[str, int, date]] = []  # (org, round, cut-off) of each retention request
        self.profile_erasure_every = profile_erasure_every  # 0: no profile erasures
        self.profile_erasure_rng = random.Random(f"profile_erasure/{seed}")  # its own stream, like landing_rng
        self.profile_erasure_counter = 0  # its own ids ("E"), like retention_counter
        self.profile_erasure_seq = (
            0  # its own CDC sequence: its ids are no other change's, so per id it only has to grow
        )
        self.profile_erasure_scheduled: dict[
            int, list[tuple]
        ] = {}  # round -> (topic, key, value, intent, gate), sent last
        self.profile_erasures: list[
            dict
        ] = []  # the generator's model: per request its tenant, ids, namesake tenant (tests)
        self.round = 0
        self.messages: list[Message] = []
        self.scheduled: dict[int, list[tuple]] = {}  # round -> (topic, key, value, intent, gate)
        self.rows: dict[str, dict] = {}  # the generator's own model of engagement_activity (isolated rows left out)
        self.pool = {(org, f): [] for org in ORGS for f in ("lead_id", "contact_id")}  # ids activities may name
        self.last_used: dict[tuple[str, str, str], int] = {}
        self.counter = 0
        self.clock = BASE_TIME  # request_time: strictly increasing in send order
        self.seq = {t: 0 for t in TENANTS}
        self.busy: set[tuple[str, str]] = set()  # profiles waiting for their late change
        self.bad = Counter()

    # ---- rounds --------------------------------------------------------------------------------------

    def next_round(self, generate: bool = True) -> list[Message]:
        """The messages of the next round: what earlier rounds scheduled for it, then (if `generate`) new ones.
        A landing file of the round is appended to self.landing."""
        k, start = self.round, len(self.messages)
        self.round += 1
        self.clock = max(self.clock, BASE_TIME + timedelta(seconds=2 * k))
        for topic, key, value, intent, gate in self.scheduled.pop(k, []):
            self._emit(k, topic, key, value, intent, gate)
            if intent == "late_change":
                self.busy.discard(tuple(key.decode().split("/", 1)))
        if generate:
            self._activities(k)
            if k % self.erasure_every == 5:
                self._subject(k)
            if k >= 3:
                count = int(self.requests_per_round) + (self.rng.random() < self.requests_per_round % 1)
                for _ in range(count):
                    self._request(k)
                if self.rng.random() < 0.08:
                    self._bad_request(k)
            if k % 20 == 10:
                self._bad_gdpr(k)
            for _ in range(self.profile_changes_per_round):
                self._profile_change(k)
            if self.landing_every and k % self.landing_every == self.landing_every - 1:
                self._landing_file(k)
            if self.retention_every:
                self._retention(k)
            if self.profile_erasure_every and k % self.profile_erasure_every == self.profile_erasure_every * 7 // 8:
                self._profile_erasure(k)
        for topic, key, value, intent, gate in self.profile_erasure_scheduled.pop(
            k, []
        ):  # last in the round (docstring)
            self._emit(k, topic, key, value, intent, gate)
        return self.messages[start:]

    def remaining_rounds(self) -> list[list[Message]]:
        """After the last generated round: the rounds that only send what was scheduled (late targets and changes,
        an erasure and its subject's later activities), with their own round numbers."""
        last = max([*self.scheduled, *self.profile_erasure_scheduled], default=self.round - 1)
        return [self.next_round(generate=False) for _ in range(last - self.round + 1)]

    def _emit(self, k, topic, key, value, intent, gate=None) -> None:
        self.messages.append(Message(len(self.messages), k, topic, key, value, intent, gate))

    def _later(self, k, topic, key, value, intent, gate=None) -> None:
        assert k >= self.round, "scheduled for a round already generated"
        self.scheduled.setdefault(k, []).append((topic, key, value, intent, gate))

    def _spoiled(self, family: str, kinds: dict, record: dict) -> tuple[str, bytes]:
        """The next bad kind of `family` (in turn, so every kind occurs) and `record` spoiled that way."""
        kind = list(kinds)[self.bad[family] % len(kinds)]
        self.bad[family] += 1
        if kind == "malformed_record":
            return kind, dumps(record)[:-7]
        return kind, dumps({k: v for k, v in {**record, **kinds[kind]}.items() if v is not DROP})

    def _id(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}S{self.seed}N{self.counter:06d}"  # alphanumeric, fixed width: no id is a token of another

    # ---- activities ----------------------------------------------------------------------------------

    def _activity(
        self,
        org: str,
        field: str,
        owner: str,
        rng: random.Random | None = None,
        eid: str | None = None,
        day: date | None = None,
    ) -> dict:
        """A good activity of `owner`; by default from self.rng, a new id and a day in January 2026 (an old activity
        passes its own stream, id and day)."""
        rng, eid = rng or self.rng, eid or self._id("e")
        kind = rng.choice(ACTIVITY_TYPES)
        day = FIRST_DAY + timedelta(days=rng.randint(0, 27)) if day is None else day
        record = {
            "engagement_id": eid,
            "org_id": org,
            "activity_type": kind,
            "event_time": f"{day.isoformat()}T{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:00Z",
            "user_id": f"005S{self.seed}U{rng.randint(0, 9)}",
            "lead_id": None,
            "contact_id": None,
            "account_id": None,
            "subject": f"soak {eid}" if rng.random() < 0.7 else None,
            "payload": {"step": rng.randint(1, 8)},
        }
        record[field] = owner
        if field == "contact_id":
            record["account_id"] = f"001S{self.seed}A{rng.randint(0, 20)}"
        if kind == "call":
            record["duration_seconds"] = rng.randint(0, 1800)
        return record

    def _activities(self, k: int) -> None:
        rng = self.rng
        for _ in range(self.activities_per_round):
            org, field = rng.choice(ORGS), "lead_id" if rng.random() < 0.6 else "contact_id"
            pool = self.pool[(org, field)]
            if len(pool) < 4 or rng.random() < 0.15:
                pool.append(self._id("00Q" if field == "lead_id" else "003"))
            owner = rng.choice(pool)
            self.last_used[(org, field, owner)] = k
            record = self._activity(org, field, owner)
            self.rows[record["engagement_id"]] = {
                **{f: record[f] for f in ("org_id", *OWNERS, "activity_type", "subject")},
                "round": k,
                "engagement_date": date.fromisoformat(record["event_time"][:10]),
            }
            self._emit(k, ACTIVITIES, org.encode(), dumps(record), "good")
            if rng.random() < 0.08:  # a producer retry: the same bytes again, same key (same partition, later offset)
                self._emit(k, ACTIVITIES, org.encode(), dumps(record), "duplicate")
        if rng.random() < 0.25:  # on no lead or contact: no erasure ever touches it
            kind, value = self._spoiled(ACTIVITIES, BAD_ACTIVITIES, self._activity(rng.choice(ORGS), "lead_id", None))
            self._emit(k, ACTIVITIES, b"bad", value, f"bad:{kind}")

    def _subject(self, k: int) -> None:
        """A lead who is erased: activities in the next 3 rounds, the erasure request 2 rounds later, two activities
        after it (gated on the retention stream), and a namesake in another org before and after (kept)."""
        org = ORGS[(k // self.erasure_every) % len(ORGS)]
        other = ORGS[(ORGS.index(org) + 1) % len(ORGS)]
        subject = self._id("00Q")
        for r in (k + 1, k + 2, k + 3):
            self._later(r, ACTIVITIES, org.encode(), dumps(self._activity(org, "lead_id", subject)), "subject")
        self._later(k + 2, ACTIVITIES, other.encode(), dumps(self._activity(other, "lead_id", subject)), "namesake")
        erasure = {
            "request_id": self._id("g"),
            "org_id": org,
            "request_time": iso(BASE_TIME + timedelta(seconds=2 * (k + 5))),
            "kind": "erasure",
            "subject_id": subject,
        }
        self._later(k + 5, GDPR, org.encode(), dumps(erasure), "erasure")
        gate = Gate(RETENTION, GDPR, k + 5)
        for r in (k + 7, k + 9):
            self._later(
                r,
                ACTIVITIES,
                org.encode(),
                dumps(self._activity(org, "lead_id", subject)),
                "subject_after_erasure",
                gate,
            )
        self._later(k + 8, ACTIVITIES, other.encode(), dumps(self._activity(other, "lead_id", subject)), "namesake")

    def _owners(self, org: str, field: str, k: int) -> list[str]:
        """Ids of `field` in `org` that hold rows and that no activity of this round names."""
        held = {r[field] for r in self.rows.values() if r["org_id"] == org and r[field] is not None}
        return sorted(i for i in held if self.last_used.get((org, field, i), -1) < k)

    def _retire(self, org: str, field: str, owner: str) -> None:
        """No activity names `owner` from now on: a request touched it, and a later activity would miss it."""
        self.pool[(org, field)] = [i for i in self.pool.get((org, field), []) if i != owner]

    def _base(self, org: str, k: int, op: str) -> dict:
        self.clock += timedelta(milliseconds=1)
        return {"request_id": self._id("m"), "org_id": org, "request_time": iso(self.clock), "op": op}

    def _request(self, k: int) -> None:
        rng = self.rng
        org, op = rng.choice(ORGS), rng.choices(OPS, OP_WEIGHTS)[0]
        rows = [(eid, r) for eid, r in sorted(self.rows.items()) if r["org_id"] == org and r["round"] < k]
        request = None
        if op == "convert" and (leads := self._owners(org, "lead_id", k)):
            lead, to = rng.choice(leads), self._id("003")
            request = {
                **self._base(org, k, op),
                "from_field": "lead_id",
                "from_id": lead,
                "to_field": "contact_id",
                "to_id": to,
            }
            hits = [r for _, r in rows if r["lead_id"] == lead]
            if rng.random() < 0.3:  # a date range holding at least one of the lead's rows: the target exists
                day = rng.choice(hits)["engagement_date"]
                lo, hi = day - timedelta(days=rng.randint(0, 2)), day + timedelta(days=rng.randint(0, 2))
                request.update(date_from=lo.isoformat(), date_to=hi.isoformat())
                hits = [r for r in hits if lo <= r["engagement_date"] <= hi]
            for r in hits:
                r.update(lead_id=None, contact_id=to)
            self._retire(org, "lead_id", lead)
        elif op == "merge" and len(contacts := self._owners(org, "contact_id", k)) >= 2:
            sources, to = rng.sample(contacts, 2), self._id("003")
            request = {**self._base(org, k, op), "field": "contact_id", "from_ids": sources, "to_id": to}
            for _, r in rows:
                if r["contact_id"] in sources:
                    r["contact_id"] = to
            for c in sources:
                self._retire(org, "contact_id", c)
        elif op == "delete_owner" and (owners := self._owners(org, field := rng.choice(("lead_id", "contact_id")), k)):
            owner = rng.choice(owners)
            request = {**self._base(org, k, "delete"), "field": field, "id": owner}
            for eid, r in rows:
                if r[field] == owner:
                    del self.rows[eid]
            self._retire(org, field, owner)
        elif op in ("delete_engagement", "update") and rows:
            eid, row = rng.choice(rows)
            if op == "delete_engagement":
                request = {**self._base(org, k, "delete"), "engagement_id": eid}
                del self.rows[eid]
            else:
                day = FIRST_DAY + timedelta(days=rng.randint(0, 27))
                record = {
                    **{f: row[f] for f in OWNERS},
                    "engagement_date": day.isoformat(),
                    "activity_type": rng.choice(ACTIVITY_TYPES),
                    "subject": f"updated {eid}",
                }
                request = {**self._base(org, k, op), "engagement_id": eid, "record": record}
                row.update(record, engagement_date=day)
        elif op == "late":
            request = self._late_request(org, k)
        if request is None:
            return
        gate = Gate(INGESTION, ACTIVITIES, k - 1)
        self._emit(k, MUTATIONS, org.encode(), dumps(request), "late_request" if op == "late" else "request", gate)
        if op != "late" and rng.random() < 0.1:  # a producer retry of the request
            self._emit(k, MUTATIONS, org.encode(), dumps(request), "duplicate_request", gate)

    def _late_request(self, org: str, k: int) -> dict:
        """A request whose target, one activity of a lead nobody else uses, is produced 8-25 rounds later: long enough
        for the request (sent once the activities before it are committed) to reach a mutation batch first."""
        record = self._activity(org, "lead_id", self._id("00Q"))
        self._later(k + self.rng.randint(8, 25), ACTIVITIES, org.encode(), dumps(record), "late_target")
        kind = self.counter % 3
        if kind == 0:
            return {
                **self._base(org, k, "convert"),
                "from_field": "lead_id",
                "from_id": record["lead_id"],
                "to_field": "contact_id",
                "to_id": self._id("003"),
            }
        if kind == 1:
            return {**self._base(org, k, "delete"), "engagement_id": record["engagement_id"]}
        return {
            **self._base(org, k, "update"),
            "engagement_id": record["engagement_id"],
            "record": {
                **{f: record[f] for f in OWNERS},
                "engagement_date": "2026-01-31",
                "activity_type": "meeting",
                "subject": "late",
            },
        }

    def _bad_request(self, k: int) -> None:
        org = self.rng.choice(ORGS)  # ids no activity uses
        request = {
            **self._base(org, k, "convert"),
            "from_field": "lead_id",
            "from_id": self._id("00Q"),
            "to_field": "contact_id",
            "to_id": self._id("003"),
        }
        kind, value = self._spoiled(MUTATIONS, BAD_REQUESTS, request)
        self._emit(k, MUTATIONS, org.encode(), value, f"bad:{kind}", Gate(INGESTION, ACTIVITIES, k - 1))

    def _bad_gdpr(self, k: int) -> None:
        org = self.rng.choice(ORGS)
        request = {
            "request_id": self._id("g"),
            "org_id": org,
            "request_time": iso(BASE_TIME + timedelta(seconds=2 * k)),
            "kind": "erasure",
            "subject_id": self._id("00Q"),
        }  # an id no activity uses: never erased
        kind, value = self._spoiled(GDPR, BAD_GDPR, request)
        self._emit(k, GDPR, org.encode(), value, f"bad:{kind}")

    # ---- TTL retention -------------------------------------------------------------------------------

    def _epoch(self, k: int) -> int:
        """How many retention requests rounds 0..k hold (they come at rounds 45, 105, ... for every 60)."""
        return (k + self.retention_every - self.retention_every * 3 // 4) // self.retention_every

    def _old_day(self, epoch: int) -> date:
        """The first day of an epoch: its old activities' earliest date, and the cut-off of the request opening it."""
        return OLD_FIRST_DAY + timedelta(days=OLD_STEP_DAYS * epoch)

    def _retention_id(self, prefix: str) -> str:
        self.retention_counter += 1
        return f"{prefix}S{self.seed}T{self.retention_counter:06d}"  # as _id, with "T": no id of the other stream

    def _retention(self, k: int) -> None:
        """The round's retention request (if one is due) and, now and then, an old activity. Last in the round and
        from their own stream, so the other messages of a seed stay as they were (module docstring)."""
        epoch = self._epoch(k)
        if self._old_day(epoch + 1) > FIRST_DAY:  # the epoch's dates would reach the other activities': none any more
            return
        if k % self.retention_every == self.retention_every * 3 // 4:
            self._retention_request(k, epoch)
        if self.retention_rng.random() < 0.35:
            self._old_activity(k, epoch)

    def _retention_request(self, k: int, epoch: int) -> None:
        """A request of one org in turn whose cut-off is the epoch's first day: after every old activity of earlier
        rounds (earlier epochs), on or before those of this round and later. Gated like a mutation message."""
        org, rng = ORGS[(epoch - 1) % len(ORGS)], self.retention_rng
        at, cutoff = BASE_TIME + timedelta(seconds=2 * k), self._old_day(epoch)
        request = {
            "request_id": self._retention_id("g"),
            "org_id": org,
            "request_time": iso(at),
            "kind": "retention",
            "retention_days": (at.date() - cutoff).days,
        }  # cut-off = request_time's UTC date - retention_days
        self.cutoffs.append((org, k, cutoff))
        gate = Gate(INGESTION, ACTIVITIES, k - 1)
        self._emit(k, GDPR, org.encode(), dumps(request), "retention", gate)
        if rng.random() < 0.2:  # a producer retry of the request
            self._emit(k, GDPR, org.encode(), dumps(request), "retention_duplicate", gate)

    def _old_activity(self, k: int, epoch: int) -> None:
        """An activity dated within the epoch, on an owner of old activities only (a new one, or one of its org's
        earlier ones: retention deletes by date, whoever the owner is). The orgs take turns by round, so each has
        some by the time its request comes."""
        rng = self.retention_rng
        org, field = ORGS[k % len(ORGS)], rng.choice(("lead_id", "contact_id"))
        owners = self.old_owners[(org, field)]
        if not owners or rng.random() < 0.5:
            owners.append(self._retention_id("00Q" if field == "lead_id" else "003"))
        day = self._old_day(epoch) + timedelta(days=rng.randint(0, OLD_STEP_DAYS - 1))
        record = self._activity(org, field, rng.choice(owners), rng, self._retention_id("e"), day)
        self.old[record["engagement_id"]] = {"org_id": org, "round": k, "engagement_date": day}
        self._emit(k, ACTIVITIES, org.encode(), dumps(record), "old_activity")
        if rng.random() < 0.08:  # a producer retry: both copies come before any request that deletes them
            self._emit(k, ACTIVITIES, org.encode(), dumps(record), "old_duplicate")

    # ---- profile CDC ---------------------------------------------------------------------------------

    def _fields(self, keys: list[str], pid: str) -> dict:
        rng = self.rng
        values = {
            "email": lambda: f"{pid}.{rng.randint(0, 99)}@example.com",
            "country": lambda: rng.choice(["DE", "FR", "US", "JP"]),
            "plan": lambda: rng.choice(["free", "pro", "enterprise"]),
            "score": lambda: rng.randint(0, 100),
            "tags": lambda: rng.sample(["a", "b", "c", "d"], rng.randint(0, 2)),
        }
        return {key: values[key]() for key in keys}

    def _change(self, tenant: str, pid: str, k: int, op: str = "upsert", fields: dict | None = None) -> dict:
        self.seq[tenant] += 1
        change = {
            "tenant": tenant,
            "primary_id": pid,
            "record_type": "person",
            "op": op,
            "cdc_seq": self.seq[tenant],
            "cdc_ts": iso(BASE_TIME + timedelta(seconds=2 * k, milliseconds=self.seq[tenant] % 1000)),
        }
        if op == "upsert":
            change["fields"] = fields or {}
        return change

    def _profile_change(self, k: int) -> None:
        rng = self.rng
        tenant = rng.choice(TENANTS)
        pid = rng.choice([p for p in (f"p{n}" for n in range(1, 41)) if (tenant, p) not in self.busy])
        key, roll = f"{tenant}/{pid}".encode(), rng.random()
        keys = rng.sample(["email", "country", "plan", "score", "tags"], rng.randint(1, 3))
        if roll < 0.03:
            kind, value = self._spoiled(
                PROFILES, BAD_PROFILES, self._change(tenant, pid, k, fields=self._fields(keys, pid))
            )
            self._emit(k, PROFILES, b"bad", value, f"bad:{kind}")
        elif roll < 0.11:  # late: L (lower sequence) arrives 3-15 rounds after N (another staging batch, mostly), and N
            # sets every key L sets, or deletes: L then changes nothing whether the processor folds it or drops it
            late = self._change(tenant, pid, k, fields=self._fields(keys[: max(1, len(keys) - 1)], pid))
            newer = (
                self._change(tenant, pid, k, "delete")
                if rng.random() < 0.3
                else self._change(tenant, pid, k, fields=self._fields(keys, pid))
            )
            self._emit(k, PROFILES, key, dumps(newer), "profile_change")
            self._later(k + rng.randint(3, 15), PROFILES, key, dumps(late), "late_change")
            self.busy.add((tenant, pid))
        elif roll < 0.16:
            self._emit(k, PROFILES, key, dumps(self._change(tenant, pid, k, "delete")), "profile_change")
        else:
            fields = self._fields(keys, pid)
            if rng.random() < 0.1:
                fields[rng.choice(keys)] = None  # "not captured": keeps the stored value
            change = self._change(tenant, pid, k, fields=fields)
            if rng.random() < 0.15:
                change["related_ids"] = rng.sample([f"p{n}" for n in range(1, 41) if f"p{n}" != pid], rng.randint(1, 2))
            self._emit(k, PROFILES, key, dumps(change), "profile_change")

    # ---- profile erasure ------------------------------------------------------------------------------

    def _profile_erasure_id(self, prefix: str) -> str:
        self.profile_erasure_counter += 1
        return (
            f"{prefix}S{self.seed}E{self.profile_erasure_counter:06d}"  # as _id, with "E": no id of the other streams
        )

    def _profile_erasure_later(
        self, k: int, topic: str, key: bytes, value: bytes, intent: str, gate: Gate | None = None
    ) -> None:
        assert k >= self.round - 1, "scheduled for a round already sent"
        self.profile_erasure_scheduled.setdefault(k, []).append((topic, key, value, intent, gate))

    def _erasure_change(
        self, tenant: str, pid: str, k: int, op: str = "upsert", related: list[str] | None = None
    ) -> dict:
        """A CDC change of one of the profile erasure's own ids: its own sequence and fields (profile_erasure_rng)."""
        rng = self.profile_erasure_rng
        self.profile_erasure_seq += 1
        change = {
            "tenant": tenant,
            "primary_id": pid,
            "record_type": "person",
            "op": op,
            "cdc_seq": self.profile_erasure_seq,
            "cdc_ts": iso(BASE_TIME + timedelta(seconds=2 * k, milliseconds=self.profile_erasure_seq % 1000)),
        }
        if op == "upsert":
            change["fields"] = {
                "email": f"{pid}@example.com",
                "plan": rng.choice(["free", "pro", "enterprise"]),
                "score": rng.randint(0, 100),
            }
            if rng.random() < 0.3:
                change["fields"][rng.choice(["plan", "score"])] = None  # "not captured": keeps the stored value
        if related is not None:
            change["related_ids"] = related
        return change

    def _profile_erasure(self, k: int) -> None:
        """A profile of one tenant in turn erased (PROFILE_ERASURE_KINDS in turn), from rounds k to k+7:

        k, k+1, k+2  the subject's changes ("linked": the first links a second id, which has changes of its own, and a
                     later one carries no related_ids, so the link stays; "alone": the last is a delete), and a bad change
                     naming the subject (quarantined, then deleted by the erasure); "nowhere": none of these. A namesake
                     (the same id) in the next tenant: a change here and at k+5, kept;
        k+3          the erasure request, gated on the dumper having staged every change of rounds <= k+2 (so the
                     identity it erases is that of those changes, whatever the processor merged), sometimes a producer
                     retry of it (refused as repeated and, naming an erased id, suppressed, whichever batch reads it), and
                     a bad request of another kind in turn (ungated: it names ids nothing else uses);
        k+5, k+7     changes of every erased id, a change of a new id linking to the subject and a bad change naming
                     it, each gated on the erasure stream having committed the request: the dumper drops them all.
        Sent last in their rounds, from their own stream and counter: the other messages of a seed stay as they were."""
        rng, i = self.profile_erasure_rng, k // self.profile_erasure_every
        tenant, other = TENANTS[i % len(TENANTS)], TENANTS[(i + 1) % len(TENANTS)]
        kind = PROFILE_ERASURE_KINDS[(i + i // len(TENANTS)) % len(PROFILE_ERASURE_KINDS)]  # every kind in every tenant
        subject = self._profile_erasure_id("u")
        linked = self._profile_erasure_id("u") if kind == "linked" else None
        ids = [subject] + ([linked] if linked else [])

        def cdc(r: int, change: dict, intent: str, gate: Gate | None = None) -> None:
            self._profile_erasure_later(
                r, PROFILES, f"{change['tenant']}/{change['primary_id']}".encode(), dumps(change), intent, gate
            )

        def bad(r: int, spoil: dict, intent: str, gate: Gate | None = None) -> None:
            change = {
                **self._erasure_change(tenant, subject, r),
                **spoil,
            }  # names the subject: stored nowhere in the end
            self._profile_erasure_later(r, PROFILES, f"{tenant}/{subject}".encode(), dumps(change), intent, gate)

        cdc(k, self._erasure_change(other, subject, k), "profile_namesake")
        if kind != "nowhere":
            cdc(k, self._erasure_change(tenant, subject, k, related=[linked] if linked else None), "erased_profile")
            if linked:
                cdc(k, self._erasure_change(tenant, linked, k), "erased_profile")
                cdc(k + 1, self._erasure_change(tenant, linked, k + 1), "erased_profile")
            cdc(k + 1, self._erasure_change(tenant, subject, k + 1), "erased_profile")
            bad(k + 1, {"fields": "[1, 2]"}, "erased_profile_bad")  # invalid_json
            cdc(
                k + 2,
                self._erasure_change(tenant, subject, k + 2, "delete" if kind == "alone" else "upsert"),
                "erased_profile",
            )
        request = {
            "request_id": self._profile_erasure_id("pe"),
            "tenant": tenant,
            "subject_id": subject,
            "request_time": iso(BASE_TIME + timedelta(seconds=2 * (k + 3))),
        }
        gate = Gate(PROFILE_CDC, PROFILES, k + 2)
        self._profile_erasure_later(k + 3, PROFILE_ERASURES, tenant.encode(), dumps(request), "profile_erasure", gate)
        if rng.random() < 0.3:
            self._profile_erasure_later(
                k + 3, PROFILE_ERASURES, tenant.encode(), dumps(request), "profile_erasure_duplicate", gate
            )
        spoiled = {
            "request_id": self._profile_erasure_id("pe"),
            "tenant": tenant,
            "subject_id": self._profile_erasure_id("u"),
            "request_time": iso(BASE_TIME + timedelta(seconds=2 * (k + 3))),
        }
        bad_kind, value = self._spoiled(PROFILE_ERASURES, BAD_PROFILE_ERASURES, spoiled)
        self._profile_erasure_later(k + 3, PROFILE_ERASURES, tenant.encode(), value, f"bad:{bad_kind}")
        self.profile_erasures.append(
            {
                "round": k + 3,
                "tenant": tenant,
                "request_id": request["request_id"],
                "kind": kind,
                "ids": set(ids),
                "namesake": other,
            }
        )
        after = Gate(PROFILE_ERASURE, PROFILE_ERASURES, k + 3, queued=True)
        cdc(k + 5, self._erasure_change(other, subject, k + 5), "profile_namesake")  # another tenant's person: kept
        for pid in ids:
            cdc(k + 5, self._erasure_change(tenant, pid, k + 5), "after_profile_erasure", after)
        newcomer = self._profile_erasure_id("u")  # links itself to the erased subject: dropped whole
        cdc(k + 5, self._erasure_change(tenant, newcomer, k + 5, related=[subject]), "after_profile_erasure", after)
        bad(k + 7, {"op": "merge"}, "after_profile_erasure_bad", after)  # not_in_enum
        cdc(k + 7, self._erasure_change(tenant, subject, k + 7, "delete"), "after_profile_erasure", after)

    # ---- landing files -------------------------------------------------------------------------------

    def _member(self) -> dict[str, str]:
        """A good row of the export (source columns, as text), with a new member id."""
        rng = self.landing_rng
        self.member += 1
        first = rng.choice(FIRST_NAMES)
        name = (
            first if rng.random() < 0.1 else f"{first} {rng.choice(LAST_NAMES)}"
        )  # min_parts 1: one word is a first name
        born = date(1930, 1, 1) + timedelta(days=rng.randint(0, 27_000))
        bday = born.strftime("%m/%d/%Y") if rng.random() < 0.5 else born.isoformat()  # the cast's two formats
        points = (
            rng.choice((0, 1_000_000)) if rng.random() < 0.1 else rng.randint(1, 50_000)
        )  # the bounds are inclusive
        email = f"{first.split()[0].lower()}.{self.member}@example.com"
        return {
            "id": str(self.member),
            "name": name,
            "bday": bday,
            "level": rng.choice(LEVELS),
            "email": email,
            "points": str(points),
        }

    def _bad_member(self) -> tuple[str, str]:
        """(line, intent) of the next bad kind (in turn, so every kind occurs), on a row with its own member id."""
        kind, changes = BAD_MEMBERS[self.bad[LANDING] % len(BAD_MEMBERS)]
        self.bad[LANDING] += 1
        row = self._member()
        line = f'{row["id"]},"Unclosed, quote' if changes is None else ",".join({**row, **changes}.values())
        return line, f"bad:{kind}"

    def _landing_file(self, k: int) -> None:
        """An export of 27-32 good rows with 2-3 bad lines among them: at most 10% rejected, the pipeline's
        error-rate bound, so its check passes like every other. No value holds a comma or a quote: joined with
        commas, each row is a CSV line of 6 fields."""
        rng = self.landing_rng
        lines = [(",".join(row.values()), "good") for row in (self._member() for _ in range(rng.randint(27, 32)))]
        for _ in range(rng.randint(2, 3)):
            lines.insert(rng.randint(0, len(lines)), self._bad_member())
        data = "\n".join([",".join(MEMBER_COLUMNS), *(line for line, _ in lines)]) + "\n"
        # zero-padded: the sensor plans waiting files in path order, which is then the order they landed in
        self.landing.append(
            LandingFile(k, f"soak-s{self.seed}-r{k:06d}.csv", data.encode(), tuple(i for _, i in lines))
        )
