// Opens the local trial's console in Debian's Chromium (headless, driven by playwright-core)
// and waits until every given text shows on the page, as the events arrive live.
//
//   node $D/ts/console_check.mjs URL SCREENSHOT_PATH TEXT...
//
// Prints `READY` once the page is open and its event stream is live (do what should appear
// after that), then ONE JSON line {"found":[...],"missing":[...],"rows":N,"empty":{...},
// "groups":[...],"loose":[...]} and exits 0 when every TEXT was found within 20 s (2
// otherwise). The screenshot is taken either way. `empty` is what the page showed at READY
// (`endpoint`, `try`: the text of #endpoint and #try, `shown`: whether #empty was visible);
// `groups` the interaction groups ({interaction, rows: [row text]}), `loose` the text of the
// rows in no group, newest first.
// CHROMIUM_PATH overrides the browser (default /usr/bin/chromium).
import { existsSync } from 'node:fs';
import { chromium } from 'playwright-core';

const [url, shot, ...texts] = process.argv.slice(2);
const executablePath =
  process.env.CHROMIUM_PATH || ['/usr/bin/chromium', '/usr/bin/chromium-browser'].find((p) => existsSync(p));
if (!executablePath) {
  console.log(JSON.stringify({ error: 'no Chromium: apt-get install chromium, or set CHROMIUM_PATH' }));
  process.exit(2);
}
const browser = await chromium.launch({ executablePath, headless: true, args: ['--no-sandbox'] });
let code = 2;
try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  await page.goto(url);
  await page.locator('#status.live').waitFor({ timeout: 10000 });
  const text = async (sel) => ((await page.locator(sel).count()) ? page.locator(sel).first().innerText() : null);
  const empty = { endpoint: await text('#endpoint'), try: await text('#try'), shown: await page.locator('#empty').isVisible() };
  console.log('READY');
  const found = [];
  const missing = [];
  // The calls that make these texts run once READY is printed; on a loaded machine (CI builds
  // the image beside the tests) they take tens of seconds. Found texts return at once.
  const deadline = Date.now() + 60000;
  for (const text of texts) {
    const left = Math.max(deadline - Date.now(), 1);
    try {
      await page.getByText(text, { exact: false }).first().waitFor({ timeout: left });
      found.push(text);
    } catch {
      missing.push(text);
    }
  }
  await page.screenshot({ path: shot, fullPage: true });
  const rows = await page.locator('#events > li').count();
  const { groups, loose } = await page.evaluate(() => ({
    groups: [...document.querySelectorAll('#events > li.interaction')].map((g) => ({
      interaction: g.dataset.interaction,
      rows: [...g.querySelectorAll('li.row')].map((r) => r.innerText.replace(/\s+/g, ' ').trim()),
    })),
    loose: [...document.querySelectorAll('#events > li.row')].map((r) => r.innerText.replace(/\s+/g, ' ').trim()),
  }));
  console.log(JSON.stringify({ found, missing, rows, empty, groups, loose }));
  code = missing.length === 0 ? 0 : 2;
} finally {
  await browser.close();
}
process.exit(code);
