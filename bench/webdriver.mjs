// A minimal W3C WebDriver client (geckodriver + Firefox) with the slice of
// Playwright's Page API the browser benchmarks use: newPage, goto, title,
// evaluate(fn, arg), waitForFunction, bringToFront, close. Playwright cannot
// download its own Firefox here, and the system firefox-esr speaks WebDriver
// through geckodriver (installed by scripts/bootstrap.sh).
import { spawnListening } from '../scripts/listening.mjs';

// `prefs`: more Firefox preferences (a test's quota limit, say).
export async function launchFirefox({ geckodriver = process.env.GECKODRIVER || 'geckodriver', binary, prefs = {} } = {}) {
  // geckodriver binds port 0 itself and prints "Listening on 127.0.0.1:<port>":
  // no probed port another process could take before it binds.
  const { base, stop } = await spawnListening(geckodriver, ['--port', '0', '--host', '127.0.0.1'], {
    listening: /Listening on 127\.0\.0\.1:(\d+)/,
  });
  const call = async (method, path, body) => {
    const r = await fetch(base + path, {
      method,
      headers: { 'content-type': 'application/json' },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const j = await r.json();
    if (j.value && j.value.error) throw new Error(`webdriver ${path}: ${j.value.error}: ${j.value.message}`);
    return j.value;
  };
  let session;
  try {
    session = await call('POST', '/session', {
      capabilities: {
        alwaysMatch: {
          browserName: 'firefox',
          'moz:firefoxOptions': {
            ...(binary ? { binary } : {}),
            args: ['-headless'],
            // Background windows must not be throttled (each contender has one).
            prefs: {
              'dom.min_background_timeout_value': 0,
              'dom.timeout.enable_budget_timer_throttling': false,
              'browser.tabs.remote.separatedMozillaDomains': '',
              ...prefs,
            },
          },
        },
      },
    });
  } catch (e) {
    // No session, no close(): geckodriver would keep Node alive.
    await stop();
    throw e;
  }
  const sid = session.sessionId;
  const version = `Firefox ${session.capabilities.browserVersion}`;
  const s = (p) => `/session/${sid}${p}`;
  await call('POST', s('/timeouts'), { script: 600_000, pageLoad: 120_000 });
  let first = await call('GET', s('/window'));
  let current = first;
  const use = async (h) => {
    if (current !== h) await call('POST', s('/window'), { handle: h });
    current = h;
  };
  const newPage = async () => {
    let handle;
    if (first) {
      handle = first;
      first = null;
    } else {
      handle = (await call('POST', s('/window/new'), { type: 'window' })).handle;
    }
    const page = {
      on() {},
      async goto(url) {
        await use(handle);
        await call('POST', s('/url'), { url });
      },
      async title() {
        await use(handle);
        return call('GET', s('/title'));
      },
      async evaluate(fn, arg) {
        await use(handle);
        const script = `const done = arguments[arguments.length - 1];
          Promise.resolve().then(() => (${fn})(arguments[0]))
            .then((v) => done({ v }), (e) => done({ e: String(e && e.stack || e) }));`;
        const r = await call('POST', s('/execute/async'), { script, args: [arg ?? null] });
        if (r && r.e) throw new Error(r.e);
        return r ? r.v : undefined;
      },
      async waitForFunction(fn, arg, { timeout = 30_000 } = {}) {
        const t0 = Date.now();
        while (!(await page.evaluate(fn, arg))) {
          if (Date.now() - t0 > timeout) throw new Error('waitForFunction: timeout');
          await new Promise((r) => setTimeout(r, 100));
        }
      },
      async bringToFront() {
        await use(handle);
      },
    };
    return page;
  };
  return {
    version,
    newPage,
    async close() {
      try {
        await call('DELETE', s(''));
      } finally {
        await stop();
      }
    },
  };
}

/**
 * The analysis pages' browser: Firefox through geckodriver (`$FIREFOX`), or
 * headless Chromium (`$CHROMIUM`, default /usr/bin/chromium) on the on-disk
 * profile `profile`, with `extraArgs` after `--no-sandbox`.
 */
export async function launchBrowser(browser, profile, extraArgs = []) {
  if (browser === 'firefox') return launchFirefox({ binary: process.env.FIREFOX });
  const { chromium } = await import('playwright-core');
  return chromium.launchPersistentContext(profile, {
    executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
    headless: true,
    args: ['--no-sandbox', ...extraArgs],
  });
}
