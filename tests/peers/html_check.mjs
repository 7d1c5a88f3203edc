// Loads pages in Debian's Chromium (headless, driven by playwright-core, scripting on) and
// reports what its parser made of each: the agent-feedback element, the title, the body's
// visible text and every textarea's value. Prints ONE JSON line: an array, one entry per URL in
// the order given, {"url":…,"feedback":{"tag":…,"type":…,"json":…}|null,"title":…,"text":…,
// "textareas":[…]} or {"url":…,"error":…}.
//
//   node html_check.mjs URL...
//
// playwright-core is loaded from $EPODE_PEERS_TS/node_modules, so the script runs from the
// source tree as well. CHROMIUM_PATH overrides the browser (default /usr/bin/chromium).
import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';

const require = createRequire(`${process.env.EPODE_PEERS_TS}/`);
const { chromium } = require('playwright-core');

const urls = process.argv.slice(2);
const executablePath =
  process.env.CHROMIUM_PATH || ['/usr/bin/chromium', '/usr/bin/chromium-browser'].find((p) => existsSync(p));
if (!executablePath) {
  console.log(JSON.stringify({ error: 'no Chromium: apt-get install chromium, or set CHROMIUM_PATH' }));
  process.exit(2);
}
const browser = await chromium.launch({ executablePath, headless: true, args: ['--no-sandbox'] });
const out = [];
try {
  const page = await browser.newPage();
  for (const url of urls) {
    try {
      await page.goto(url);
      const seen = await page.evaluate(() => {
        const el = document.getElementById('agent-feedback');
        return {
          feedback: el ? { tag: el.tagName, type: el.getAttribute('type'), json: el.textContent } : null,
          title: document.title,
          text: document.body ? document.body.innerText : null,
          textareas: [...document.querySelectorAll('textarea')].map((t) => t.value),
        };
      });
      out.push({ url, ...seen });
    } catch (e) {
      out.push({ url, error: String(e) });
    }
  }
} finally {
  await browser.close();
}
console.log(JSON.stringify(out));
