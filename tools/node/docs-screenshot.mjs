// Screenshot of the API reference page (GET /docs) for docs/img/api-docs.png.
// `make docs/images` (tools/docs-images.sh) runs it against the
// `oncekey serve` it starts.
//
// Redoc renders after the page's load event: it fetches /openapi.yaml,
// parses it and builds the sidebar and the sections. A screenshot taken at
// "load" shows its "Loading…" spinner, and one taken after a fixed delay
// shows whatever part was ready by then. So this waits for what the picture
// must show: the API title, a sidebar entry for every tag of the served
// contract (orders, payments, bonus, operations…) and a section for every
// operation, then for the network to go quiet and two frames to paint. It
// writes the PNG only when all of that rendered, and fails naming what did
// not, so a half-rendered page never replaces the committed picture.
//
// The picture is one operation, not the introduction: SHOWN's section, with
// its Idempotency-Key parameter and its 202 and 409 answers, which the
// script checks are on it.
//
// Usage: node docs-screenshot.mjs OUT.png
// Environment:
//   ONCEKEY_URL    base URL of the server, e.g. http://127.0.0.1:18181
//   CHROMIUM_PATH  optional; default /usr/bin/chromium (Debian's package).

import { mkdir, rename, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';

import { chromium } from 'playwright-core';
import { parse as parseYAML } from 'yaml';

const baseURL = (process.env.ONCEKEY_URL || '').replace(/\/+$/, '');
const chromiumPath = process.env.CHROMIUM_PATH || '/usr/bin/chromium';
const out = process.argv[2];

// What docs/service.md shows: the reference of creating an order, which takes an
// Idempotency-Key and answers 202 (in progress) and 409 (key reused).
const VIEWPORT = { width: 1280, height: 900 };
const SHOWN = 'createOrder';
const SHOWN_MUST_SAY = ['Idempotency-Key', '202', '409'];
const MAX_HEIGHT = 1600;
const RENDER_TIMEOUT_MS = 60_000;
const HTTP_METHODS = ['get', 'put', 'post', 'delete', 'options', 'head', 'patch', 'trace'];

function fail(message) {
  throw new Error(message);
}

async function main() {
  if (!baseURL || !out) fail('usage: ONCEKEY_URL=http://host:port node docs-screenshot.mjs OUT.png');
  const origin = new URL(baseURL).origin;

  // The contract as the server serves it: its tags are the sidebar's groups.
  const specResponse = await fetch(`${baseURL}/openapi.yaml`);
  if (specResponse.status !== 200) fail(`GET /openapi.yaml: ${specResponse.status}`);
  const spec = parseYAML(await specResponse.text());
  const tags = new Set((spec.tags ?? []).map((t) => t.name));
  let operations = 0;
  for (const item of Object.values(spec.paths ?? {})) {
    for (const method of HTTP_METHODS) {
      if (!item?.[method]) continue;
      operations++;
      for (const tag of item[method].tags ?? []) tags.add(tag);
    }
  }
  if (tags.size === 0 || operations === 0) fail('the served contract has no tags or no operations');

  const userDataDir = await mkdtemp(path.join(tmpdir(), 'oncekey-docs-screenshot-'));
  const context = await chromium.launchPersistentContext(userDataDir, {
    executablePath: chromiumPath,
    headless: true,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'],
    viewport: VIEWPORT,
    deviceScaleFactor: 1,
  });
  try {
    // The page must render from the server alone, as it does offline.
    await context.route((url) => !url.href.startsWith('data:') && !url.href.startsWith('blob:') && url.origin !== origin, (route) => route.abort('blockedbyclient'));
    const page = context.pages()[0] ?? (await context.newPage());
    const response = await page.goto(`${baseURL}/docs`, { waitUntil: 'load', timeout: RENDER_TIMEOUT_MS });
    if (response?.status() !== 200) fail(`GET /docs: ${response?.status()}`);

    await page.waitForSelector('.api-content h1', { timeout: RENDER_TIMEOUT_MS });
    const rendered = await page
      .waitForFunction(
        ({ tags, operations }) => {
          const menu = document.querySelector('.menu-content');
          if (!menu) return false;
          const visible = (el) => el && el.getBoundingClientRect().height > 0;
          return (
            tags.every((tag) => visible(menu.querySelector(`[data-item-id="tag/${CSS.escape(tag)}"]`))) &&
            document.querySelectorAll('[data-section-id^="operation/"]').length >= operations
          );
        },
        { tags: [...tags], operations },
        { timeout: RENDER_TIMEOUT_MS, polling: 100 },
      )
      .then(() => true, () => false);
    if (!rendered) {
      const shown = await page.$$eval('.menu-content [data-item-id^="tag/"]', (els) => els.map((e) => e.getAttribute('data-item-id')));
      fail(`Redoc did not render every tag within ${RENDER_TIMEOUT_MS / 1000}s: want ${[...tags].join(', ')}; the sidebar shows ${shown.join(', ') || 'none'}`);
    }
    await page.waitForLoadState('networkidle', { timeout: RENDER_TIMEOUT_MS }).catch(() => {});
    const section = page.locator(`[data-section-id="operation/${SHOWN}"]`);
    if ((await section.count()) !== 1) fail(`no section for operation ${SHOWN}`);
    const said = await section.innerText();
    const missing = SHOWN_MUST_SAY.filter((want) => !said.includes(want));
    if (missing.length > 0) fail(`the section of ${SHOWN} does not show ${missing.join(', ')}`);
    await section.scrollIntoViewIfNeeded();
    await page.evaluate(() => new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(done))));
    const box = await section.boundingBox();
    if (!box) fail(`the section of ${SHOWN} has no box`);
    const scrollY = await page.evaluate(() => window.scrollY);

    // Written next to OUT and renamed, so OUT is never a partial file.
    await mkdir(path.dirname(path.resolve(out)), { recursive: true });
    const partial = `${out}.partial.png`;
    await page.screenshot({
      path: partial, type: 'png', fullPage: true,
      clip: { x: 0, y: box.y + scrollY, width: VIEWPORT.width, height: Math.min(box.height, MAX_HEIGHT) },
    });
    await rename(partial, out);
    console.log(`docs-screenshot: ${out} (operation ${SHOWN}; every tag rendered: ${[...tags].join(', ')})`);
  } finally {
    await context.close().catch(() => {});
    await rm(userDataDir, { recursive: true, force: true });
  }
}

try {
  await main();
} catch (err) {
  console.error(`docs-screenshot: ${err.message}`);
  process.exitCode = 1;
}
