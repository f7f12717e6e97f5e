"""Screenshots of the running demo's Dagster UI for the README, with headless Chromium (Debian's) via Playwright.

    bash scripts/screenshots.sh                 # starts the demo, lets it run, shoots, stops it
    .venv/bin/python scripts/screenshots.py     # against a demo already running (scripts/run_platform.sh)

Before shooting it asks the running instance whether anything is red (a failed run, a failed sensor tick, a
failed asset check) and refuses to produce pictures that would hide it, unless --allow-red is given.
Pictures go to docs/images/ (README links them); re-run to refresh them.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GROUP = "/locations/__repository__@engagement_platform.definitions/asset-groups"  # the code location of workspace.yaml
# (file, path under the UI, what must be on the page before the shot, seconds to let it settle, zoom-out clicks)
PAGES = [
    ("lineage.png", f"{GROUP}/engagement", "engagement_activity", 4, 6),
    ("profiles-lineage.png", f"{GROUP}/profiles", "profile_raw", 4, 5),
    ("ingestion-partitions.png", "/assets/engagement_ingestion?view=partitions", "engagement_ingestion", 5, 0),
    ("ingestion-metadata.png", "/assets/engagement_ingestion?view=events", "records_read", 4, 0),
    ("ingestion-checks.png", "/assets/engagement_ingestion?view=checks", "records_conserved", 4, 0),
    (
        "daily-metrics-checks.png",
        "/assets/engagement_daily_metrics?view=checks",
        "daily_metrics_equal_full_recomputation",
        5,
        0,
    ),
    ("automation.png", "/automation", "engagement_ingestion_sensor", 5, 0),
    ("runs.png", "/runs", "engagement_ingestion_job", 5, 0),
]

RED = """
query Red {
  runsOrError(filter: {statuses: [FAILURE, CANCELED]}, limit: 20) { ... on Runs { results { runId jobName status } } }
  workspaceOrError { ... on Workspace { locationEntries { locationOrLoadError { ... on RepositoryLocation {
    repositories { name sensors { name sensorState { ticks(limit: 200, statuses: [FAILURE]) { id } } } } } } } } }
  assetNodes { assetKey { path } assetChecksOrError { ... on AssetChecks { checks { name executionForLatestMaterialization {
    evaluation { success } } } } } }
}
"""


def graphql(url: str, query: str) -> dict:
    request = urllib.request.Request(
        f"{url}/graphql", data=json.dumps({"query": query}).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        body = json.load(response)
    if body.get("errors"):
        raise RuntimeError(f"GraphQL errors: {body['errors']}")
    return body["data"]


def red_things(url: str) -> list[str]:
    """Failed or canceled runs, failed sensor ticks, failing latest asset-check evaluations."""
    data = graphql(url, RED)
    red = [f"run {r['jobName']} {r['runId']} {r['status']}" for r in data["runsOrError"].get("results", [])]
    for entry in data["workspaceOrError"].get("locationEntries", []):
        for repo in (entry.get("locationOrLoadError") or {}).get("repositories", []):
            for sensor in repo["sensors"]:
                failed = (sensor.get("sensorState") or {}).get("ticks") or []
                if failed:
                    red.append(f"sensor {sensor['name']}: {len(failed)} failed ticks")
    for node in data["assetNodes"]:
        for check in (node.get("assetChecksOrError") or {}).get("checks", []):
            evaluation = ((check.get("executionForLatestMaterialization") or {}).get("evaluation")) or {}
            if evaluation.get("success") is False:
                red.append(f"check {'/'.join(node['assetKey']['path'])}:{check['name']} failed")
    return red


def wait_for_ui(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"{url}/server_info", timeout=2)
            return
        except OSError:
            time.sleep(2)
    raise SystemExit(f"no Dagster UI at {url}")


def shoot(url: str, out: Path, chromium: str, width: int, height: int) -> list[Path]:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright

    out.mkdir(parents=True, exist_ok=True)
    written = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": width, "height": height}, device_scale_factor=1)
        for name, path, expect, settle, zoom_outs in PAGES:
            page.goto(f"{url}{path}", wait_until="domcontentloaded")
            try:
                page.get_by_text(expect).first.wait_for(timeout=30_000)
            except PlaywrightTimeout:  # a graph drawn in SVG may not expose the text: shoot what is there, say so
                print(f"screenshots: {expect!r} not visible on {path} after 30 s; check {name}")
            page.wait_for_timeout(settle * 1000)  # live data (plots, partitions) fills in after the first paint
            for _ in range(zoom_outs):  # the graph opens zoomed in: its zoom-out button sits at the bottom right
                page.mouse.click(width - 28, height - 149)
                page.wait_for_timeout(300)
            target = out / name
            page.screenshot(path=str(target))
            written.append(target)
            print(f"screenshot {target.relative_to(REPO) if target.is_relative_to(REPO) else target}: {url}{path}")
        browser.close()
    return written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:3000")
    parser.add_argument("--out", default=str(REPO / "docs" / "images"))
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument("--width", type=int, default=1600)
    parser.add_argument("--height", type=int, default=1000)
    parser.add_argument("--allow-red", action="store_true", help="shoot even if a run, tick or check is red")
    args = parser.parse_args()
    wait_for_ui(args.url, 300)
    red = red_things(args.url)
    for line in red:
        print(f"red: {line}")
    if red and not args.allow_red:
        print("screenshots: refusing to picture a UI with red in it (see above); --allow-red to shoot anyway")
        return 1
    shoot(args.url, Path(args.out), args.chromium, args.width, args.height)
    return 0


if __name__ == "__main__":
    sys.exit(main())
