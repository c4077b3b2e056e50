#!/usr/bin/env node
// A loopback HTTP proxy in front of the lease server, for the lease browser
// suites (tests/lease_network.rs). The first path segment picks the fault, the
// rest of the path goes to the server unchanged:
//
//   /slow-heartbeats[-<ms>]/… heartbeat requests reach the server at once (it applies
//                           them), but their ANSWERS are held back <ms>, default
//                           --delay-ms (4500: past the test server's 3 s TTL)
//   /slow-claims[-<ms>]/…    the same for claim requests (the server grants the claim)
//   /slow-releases[-<ms>]/…  the same for release requests (the server releases)
//   /drop-first-enroll-<n>/… enrollment requests with nonce <n> are cut off
//                           (socket destroyed, nothing forwarded) until
//                           /_stop/<n> is requested; later ones pass. "enrolls"
//                           in /_held/drop-first-enroll-<n> counts the ones cut
//                           off (browsers silently retry a POST once on a reset
//                           keep-alive socket: one call may count two)
//   /drop-settle-answers-<n>/… settle requests reach the server (it applies them),
//                           but their answers are cut off (socket destroyed) until
//                           /_stop/<n> is requested; later ones pass
//   /drop-release-answers-<n>/… the same for release requests
//   /hold-settle-answers-<n>/… settle requests reach the server (it applies them),
//                           but their answers are held until /_stop/<n> is
//                           requested (then sent on, and later ones pass): a test
//                           ends the hold when it has seen what it waits for,
//                           not after a fixed time; counted in /_held/<mode>
//   /drop-claim-answers-<n>/… the same for claim requests (the server grants the
//                           claim, nobody receives its token)
//   /drop-credential-answers-<n>/… the same for enrollment and refresh requests: the
//                           server issues credentials, the answers are cut off
//   /refuse-settles-<n>/…    settle requests are answered 503 {code: "network"} without
//                           reaching the server (nothing applied) until /_stop/<n>
//                           is requested; /_held/refuse-settles-<n> counts them
//   /refuse-settles-after-<ms>-<n>/… the same, the 503 sent only after <ms>
//   /throttle-settles-<n>/…  settle requests are answered 429 {code: "rate_limited"}
//                           with Retry-After: 1 (not applied: the outcome is known)
//                           until /_stop/<n>; counted as refuse-settles
//   /late-first-claim-<n>/…  the first claim REQUEST of nonce <n> is held (the
//                           server has not seen it; its client may give up on
//                           it) until a later claim of <n> has been answered by
//                           the server and that answer sent on; then it is
//                           forwarded. "late" in /_held/late-first-claim-<n> is
//                           the held request's answer status once the server
//                           answered it (0 before)
//   /late-first-enroll-<n>/… the same for enrollment requests
//   /late-first-claim-held-<n>/… the first claim REQUEST of nonce <n> is held
//                           until /_stop/<n> is requested (later claims pass
//                           meanwhile); then forwarded, its status in "late"
//   /slow-settle-requests-<ms>/… settle REQUESTS are forwarded to the server only
//                           after <ms> (anything sent meanwhile gets there first)
//   /late-heartbeats-<ms>/…  heartbeat REQUESTS are forwarded only after <ms>, and
//                           settle ANSWERS are held back 3 × <ms>: a heartbeat sent
//                           just before a settle reaches the server after it, and
//                           its answer reaches the page before the settle's
//   /late-heartbeats-refused-settles-<ms>/… heartbeat REQUESTS as late-heartbeats;
//                           settle requests never reach the server: each is
//                           answered 400 {code: "validation"} after 1.5 × <ms>
//                           (a heartbeat forwarded meanwhile counts as "raced")
//   /settle-first-<n>/…      a race forced by a barrier, not by a delay: heartbeat
//                           REQUESTS of nonce <n> wait at the proxy (counted in
//                           "held") until a settle of <n> has been applied by the
//                           server; then they go on (each counted in "raced": it
//                           reached the server after the settle landed). The
//                           settle's ANSWER is held until /_stop/<n> is requested
//                           (the test ends the hold once the page has the
//                           heartbeat's answer); after that everything passes
//   /settle-first-refused-<n>/… the same, except that settle requests never reach
//                           the server: on arrival they count as landed, and each
//                           is answered 400 {code: "validation"} on /_stop/<n>
//   /settle-first-failed-<n>/… the same, except that settle requests never reach
//                           the server and are answered 503 {code: "network"} at
//                           once (an outcome the client cannot know); the held
//                           heartbeats go on only after that answer was sent;
//                           a release request is failed the same way
//   /settle-first-landed-503-<n>/… the same, except that each settle reaches the
//                           server and its answer is replaced by a 503 with
//                           Retry-After: 30 (its outcome unknown to the client);
//                           the held heartbeats go on after that answer was sent
//   /settle-first-failed-throttled-<n>/… the first settle or release is failed
//                           so (503, heartbeats still held); each later one is
//                           answered 429 {code: "rate_limited"} (not applied),
//                           and the held heartbeats go on after the first 429
//   /_held/<mode>            {"held": n, "raced": r}: how many requests or answers of
//                           that mode are held back right now (a test waits for a
//                           count instead of sleeping), and (late-heartbeats) how
//                           many heartbeats reached the server while a settle's
//                           answer was held: the race the mode is for happened
//                           The answer also has "releases", "heartbeats" and
//                           "settles": how many such requests came through that
//                           mode (any mode, e.g. a pass-through /count-<n>/…)
//   /_redirect/<n>?to=<url>  answered 307 with Location <url> (CORS open to any
//                           origin and header, so a browser would follow it)
//   /_sink/<n>               answered 200 (CORS open); "tokens" in /_held/<n>
//                           counts the requests that reached it carrying an
//                           X-Lease-Token header (a redirect's target)
//   /body-limit-<bytes>/…    a POST whose body is over <bytes> is answered 413
//                           {code: "payload_too_large"} without reaching the server,
//                           as a server run with --max-body-bytes <bytes> answers it;
//                           others are forwarded
//   anything else            passed through
//
// Usage: node scripts/delay-proxy.mjs --target http://127.0.0.1:18787 [--listen 127.0.0.1:0] [--delay-ms 4500]
// Prints "listening http://127.0.0.1:<port>" once ready.
import http from 'node:http';

const args = Object.fromEntries(
  process.argv.slice(2).reduce((acc, v, i, a) => (v.startsWith('--') ? [...acc, [v.slice(2), a[i + 1]]] : acc), []),
);
const target = new URL(args.target ?? 'http://127.0.0.1:18787');
const [host, port] = (args.listen ?? '127.0.0.1:0').split(':');
const delayMs = Number(args['delay-ms'] ?? 4500);
const enrolls = new Map(); // mode -> enrollment requests cut off (drop-first-enroll)
const held = new Map(); // mode -> answers held back now (counted from the request's arrival)
const stopped = new Set(); // nonces <n> whose mode passes again (/_stop/<n>)
const settling = new Map(); // mode -> settle answers held back now (late-heartbeats)
const raced = new Map(); // mode -> heartbeats forwarded while a settle answer was held
const releases = new Map(); // mode -> release requests seen
const heartbeats = new Map(); // mode -> heartbeat requests seen
const settles = new Map(); // mode -> settle requests seen
const lateClaims = new Map(); // mode -> { forward: the held claim's sender, or null once sent; status }
const holding = new Map(); // nonce of hold-*-answers-<n> -> senders of the answers held until /_stop/<n>
const settleFirsts = new Map(); // nonce of settle-first-<n> -> { landed, waiting: heartbeat forwarders }

const isClaim = (path) => /^\/v1\/queues\/[^/]+\/claims$/.test(path);
const isHeartbeat = (path) => path === '/v1/heartbeats' || /^\/v1\/items\/\d+\/heartbeat$/.test(path);

const tokens = new Map(); // n -> requests to /_sink/<n> that carried X-Lease-Token

// Sends `req`'s method and headers to the server at `path` and calls
// `answered(answer, body)` once its whole answer is read, or `failed()`;
// the caller writes the request's body to the returned request and ends it.
const upstream = (req, path, answered, failed) => {
  const up = http.request(
    { host: target.hostname, port: target.port, method: req.method, path, headers: req.headers },
    (answer) => {
      const chunks = [];
      answer.on('data', (c) => chunks.push(c));
      answer.on('end', () => answered(answer, Buffer.concat(chunks)));
    },
  );
  up.on('error', failed);
  return up;
};

// CORS open to any origin and any header (a redirect target the page does
// not trust, but which would accept the lease headers).
const openCors = (req) => ({
  'access-control-allow-origin': req.headers.origin ?? '*',
  'access-control-allow-headers': req.headers['access-control-request-headers'] ?? '*',
  'access-control-allow-methods': 'GET, POST, PUT, DELETE',
});

const server = http.createServer((req, res) => {
  const open = /^\/_(redirect|sink)\/([^/?]+)/.exec(req.url ?? '');
  if (open) {
    if (req.method === 'OPTIONS') {
      res.writeHead(204, openCors(req));
    } else if (open[1] === 'redirect') {
      const to = new URL(req.url, 'http://x').searchParams.get('to') ?? '/';
      res.writeHead(307, { ...openCors(req), location: to });
    } else {
      if (req.headers['x-lease-token']) tokens.set(open[2], (tokens.get(open[2]) ?? 0) + 1);
      res.writeHead(200, { ...openCors(req), 'content-type': 'text/plain' });
    }
    res.end();
    req.resume();
    return;
  }
  if ((req.url ?? '').startsWith('/_held/')) {
    const mode = decodeURIComponent(req.url.slice('/_held/'.length));
    res.writeHead(200, { 'content-type': 'application/json', 'access-control-allow-origin': '*' });
    res.end(JSON.stringify({ held: held.get(mode) ?? 0, raced: raced.get(mode) ?? 0, releases: releases.get(mode) ?? 0, heartbeats: heartbeats.get(mode) ?? 0, settles: settles.get(mode) ?? 0, tokens: tokens.get(mode) ?? 0, enrolls: enrolls.get(mode) ?? 0, late: lateClaims.get(mode)?.status ?? 0 }));
    return;
  }
  if ((req.url ?? '').startsWith('/_stop/')) {
    const nonce = decodeURIComponent(req.url.slice('/_stop/'.length));
    stopped.add(nonce);
    for (const send of holding.get(nonce) ?? []) send();
    holding.delete(nonce);
    const first = settleFirsts.get(nonce);
    if (first) for (const forward of first.waiting.splice(0)) forward();
    res.writeHead(200, { 'content-type': 'application/json', 'access-control-allow-origin': '*' });
    res.end('{}');
    return;
  }
  const m = /^\/([^/]+)(\/.*)?$/.exec(req.url ?? '/');
  const mode = m ? m[1] : '';
  const path = m && m[2] ? m[2] : '/';
  const drop = /^drop-first-enroll-(.+)$/.exec(mode);
  if (drop && !stopped.has(drop[1]) && req.method === 'POST' && path === '/v1/workers/enroll') {
    enrolls.set(mode, (enrolls.get(mode) ?? 0) + 1);
    req.socket.destroy();
    return;
  }
  if (req.method === 'POST' && /^\/v1\/items\/\d+\/release$/.test(path)) releases.set(mode, (releases.get(mode) ?? 0) + 1);
  if (req.method === 'POST' && isHeartbeat(path)) heartbeats.set(mode, (heartbeats.get(mode) ?? 0) + 1);
  if (req.method === 'POST' && /^\/v1\/items\/\d+\/settle$/.test(path)) settles.set(mode, (settles.get(mode) ?? 0) + 1);
  const bodyLimit = /^body-limit-(\d+)$/.exec(mode);
  if (bodyLimit && req.method === 'POST') {
    const chunks = [];
    let size = 0;
    req.on('data', (c) => {
      chunks.push(c);
      size += c.length;
    });
    req.on('end', () => {
      if (size > Number(bodyLimit[1])) {
        res.writeHead(413, { 'content-type': 'application/json', 'access-control-allow-origin': '*' });
        res.end(JSON.stringify({ code: 'payload_too_large', message: 'request body too large' }));
        return;
      }
      const passOn = (answer, bytes) => {
        res.writeHead(answer.statusCode ?? 502, answer.headers);
        res.end(bytes);
      };
      upstream(req, path, passOn, () => res.destroy()).end(Buffer.concat(chunks));
    });
    return;
  }
  const lateRefused = /^late-heartbeats-refused-settles-(\d+)$/.exec(mode);
  if (lateRefused && req.method === 'POST' && /^\/v1\/items\/\d+\/settle$/.test(path)) {
    req.resume();
    // Counted as a settle whose answer is held: a heartbeat forwarded
    // meanwhile counts as `raced`.
    settling.set(mode, (settling.get(mode) ?? 0) + 1);
    setTimeout(() => {
      settling.set(mode, settling.get(mode) - 1);
      res.writeHead(400, { 'content-type': 'application/json', 'access-control-allow-origin': '*' });
      res.end(JSON.stringify({ code: 'validation', message: 'refused by the test proxy' }));
    }, 1.5 * Number(lateRefused[1]));
    return;
  }
  const lateFirst = /^late-first-(claim|enroll)-(held-)?(.+)$/.exec(mode);
  if (lateFirst && req.method === 'POST' && (lateFirst[1] === 'claim' ? isClaim(path) : path === '/v1/workers/enroll')) {
    // Forwards this request (its body read first: it can go after the page
    // gave up on it) and calls `then(status)` once the server's answer has
    // been passed on (or could not be).
    const body = [];
    let ended = false;
    req.on('data', (c) => body.push(c));
    req.on('end', () => (ended = true));
    const send = (then) => {
      if (!ended) {
        req.on('end', () => send(then));
        return;
      }
      const answered = (answer, bytes) => {
        try {
          res.writeHead(answer.statusCode ?? 502, answer.headers);
          res.end(bytes);
        } catch (e) {}
        then(answer.statusCode ?? 502);
      };
      const failed = () => {
        res.destroy();
        then(502);
      };
      upstream(req, path, answered, failed).end(Buffer.concat(body));
    };
    const late = lateClaims.get(mode);
    if (!late) {
      held.set(mode, 1);
      const entry = { forward: null, status: 0 };
      lateClaims.set(mode, entry);
      entry.forward = () => {
        held.set(mode, 0);
        send((status) => (entry.status = status));
      };
      if (lateFirst[2]) {
        const nonce = lateFirst[3];
        holding.set(nonce, [...(holding.get(nonce) ?? []), entry.forward]);
        entry.forward = null;
      }
      return;
    }
    send(() => {
      const forward = late.forward;
      late.forward = null;
      if (forward) forward();
    });
    return;
  }
  const settleFirst = /^settle-first(-refused|-failed-throttled|-failed|-landed-503)?-(.+)$/.exec(mode);
  // The failed form ends a release the same way (its outcome unknown too).
  const settlePath = new RegExp(settleFirst?.[1]?.startsWith('-failed') ? '^/v1/items/\\d+/(settle|release)$' : '^/v1/items/\\d+/settle$').test(path);
  if (settleFirst && !stopped.has(settleFirst[2]) && req.method === 'POST' && (isHeartbeat(path) || settlePath)) {
    const nonce = settleFirst[2];
    const first = settleFirsts.get(nonce) ?? { landed: false, waiting: [] };
    settleFirsts.set(nonce, first);
    const passOn = (answer, bytes) => {
      res.writeHead(answer.statusCode ?? 502, answer.headers);
      res.end(bytes);
    };
    if (isHeartbeat(path)) {
      const forward = () => {
        if (first.landed && !stopped.has(nonce)) raced.set(mode, (raced.get(mode) ?? 0) + 1);
        req.pipe(upstream(req, path, passOn, () => res.destroy()));
      };
      if (first.landed) {
        forward();
      } else {
        held.set(mode, (held.get(mode) ?? 0) + 1);
        first.waiting.push(() => {
          held.set(mode, held.get(mode) - 1);
          forward();
        });
      }
      return;
    }
    // A settle: it lands (applied by the server, or refused here), the
    // heartbeats waiting for it go on, and its answer waits for /_stop/<n>.
    const land = () => {
      first.landed = true;
      for (const forward of first.waiting.splice(0)) forward();
    };
    const hold = (send) => holding.set(nonce, [...(holding.get(nonce) ?? []), send]);
    if (settleFirst[1] === '-failed-throttled' && !first.failedOnce) {
      // The first ending call fails (503), the heartbeats stay held.
      first.failedOnce = true;
      req.resume();
      res.writeHead(503, { 'content-type': 'application/json', 'access-control-allow-origin': '*' });
      res.end(JSON.stringify({ code: 'network', message: 'failed by the test proxy' }));
    } else if (settleFirst[1] === '-failed-throttled') {
      req.resume();
      res.writeHead(429, { 'content-type': 'application/json', 'access-control-allow-origin': '*', 'retry-after': '1' });
      res.end(JSON.stringify({ code: 'rate_limited', message: 'throttled by the test proxy' }), land);
    } else if (settleFirst[1] === '-failed') {
      req.resume();
      res.writeHead(503, { 'content-type': 'application/json', 'access-control-allow-origin': '*' });
      res.end(JSON.stringify({ code: 'network', message: 'failed by the test proxy' }), land);
    } else if (settleFirst[1] === '-landed-503') {
      // Applied by the server, answered 503 with Retry-After: 30 at once.
      req.pipe(
        upstream(
          req,
          path,
          () => {
            const cors = { 'content-type': 'application/json', 'access-control-allow-origin': '*', 'access-control-expose-headers': 'retry-after', 'retry-after': '30' };
            res.writeHead(503, cors);
            res.end(JSON.stringify({ code: 'network', message: 'answer lost by the test proxy' }), land);
          },
          () => {
            land();
            res.destroy();
          },
        ),
      );
    } else if (settleFirst[1]) {
      req.resume();
      land();
      hold(() => {
        res.writeHead(400, { 'content-type': 'application/json', 'access-control-allow-origin': '*' });
        res.end(JSON.stringify({ code: 'validation', message: 'refused by the test proxy' }));
      });
    } else {
      req.pipe(
        upstream(
          req,
          path,
          (answer, bytes) => {
            land();
            hold(() => passOn(answer, bytes));
          },
          () => {
            land();
            res.destroy();
          },
        ),
      );
    }
    return;
  }
  const refuse = /^(refuse|throttle)-settles-(?:after-(\d+)-)?(.+)$/.exec(mode);
  if (refuse && !stopped.has(refuse[3]) && req.method === 'POST' && /^\/v1\/items\/\d+\/settle$/.test(path)) {
    held.set(mode, (held.get(mode) ?? 0) + 1);
    req.resume();
    setTimeout(() => {
      const cors = { 'content-type': 'application/json', 'access-control-allow-origin': '*', 'access-control-expose-headers': 'retry-after' };
      if (refuse[1] === 'throttle') {
        res.writeHead(429, { ...cors, 'retry-after': '1' });
        res.end(JSON.stringify({ code: 'rate_limited', message: 'throttled by the test proxy' }));
      } else {
        res.writeHead(503, cors);
        res.end(JSON.stringify({ code: 'network', message: 'refused by the test proxy' }));
      }
    }, Number(refuse[2] ?? 0));
    return;
  }
  const holdAnswers = /^hold-(settle)-answers-(.+)$/.exec(mode);
  if (holdAnswers && !stopped.has(holdAnswers[2]) && req.method === 'POST' && /^\/v1\/items\/\d+\/settle$/.test(path)) {
    const nonce = holdAnswers[2];
    held.set(mode, (held.get(mode) ?? 0) + 1);
    const up = upstream(req, path, (answer, bytes) => {
      const send = () => {
        held.set(mode, held.get(mode) - 1);
        res.writeHead(answer.statusCode ?? 502, answer.headers);
        res.end(bytes);
      };
      if (stopped.has(nonce)) send();
      else holding.set(nonce, [...(holding.get(nonce) ?? []), send]);
    }, () => {
      held.set(mode, held.get(mode) - 1);
      res.destroy();
    });
    req.pipe(up);
    return;
  }
  const dropAnswers = /^drop-(settle|release|credential|claim)-answers-(.+)$/.exec(mode);
  const cuts =
    dropAnswers?.[1] === 'credential'
      ? /^\/v1\/workers\/(enroll|refresh)$/
      : dropAnswers?.[1] === 'claim'
        ? { test: isClaim }
        : new RegExp(`^/v1/items/\\d+/${dropAnswers?.[1]}$`);
  const cut = dropAnswers && !stopped.has(dropAnswers[2]) && req.method === 'POST' && cuts.test(path);
  const slow = /^slow-(heartbeats|claims|releases)(?:-(\d+))?$/.exec(mode);
  const slowed =
    slow &&
    req.method === 'POST' &&
    (slow[1] === 'claims' ? isClaim(path) : slow[1] === 'releases' ? /^\/v1\/items\/\d+\/release$/.test(path) : isHeartbeat(path));
  const late = /^(slow-settle-requests|late-heartbeats)(?:-refused-settles)?-(\d+)$/.exec(mode);
  const isSettle = /^\/v1\/items\/\d+\/settle$/.test(path);
  const lateMs = late ? Number(late[2]) : 0;
  // Held before forwarding (the server has not seen them yet).
  const wait =
    late && req.method === 'POST' && (late[1] === 'late-heartbeats' ? isHeartbeat(path) : isSettle) ? lateMs : 0;
  const hold = slowed
    ? Number(slow[2] ?? delayMs)
    : late?.[1] === 'late-heartbeats' && req.method === 'POST' && isSettle
      ? 3 * lateMs
      : 0;
  const settleHold = late?.[1] === 'late-heartbeats' && hold > 0;
  let settleCounted = false;
  const done = () => {
    if (hold > 0) held.set(mode, held.get(mode) - 1);
    if (settleCounted) settling.set(mode, settling.get(mode) - 1);
    settleCounted = false;
  };
  if (hold > 0 || wait > 0) held.set(mode, (held.get(mode) ?? 0) + 1);
  const forward = () => {
    if (wait > 0) {
      held.set(mode, held.get(mode) - 1);
      if ((settling.get(mode) ?? 0) > 0) raced.set(mode, (raced.get(mode) ?? 0) + 1);
    }
    const answered = (answer, bytes) => {
      if (cut) {
        req.socket.destroy();
        return;
      }
      // The server has applied the settle; its answer is held from now.
      if (settleHold) {
        settling.set(mode, (settling.get(mode) ?? 0) + 1);
        settleCounted = true;
      }
      setTimeout(() => {
        res.writeHead(answer.statusCode ?? 502, answer.headers);
        res.end(bytes);
        done();
      }, hold);
    };
    const up = upstream(req, path, answered, () => {
      done();
      res.destroy();
    });
    req.pipe(up);
  };
  if (wait > 0) setTimeout(forward, wait);
  else forward();
});
server.listen(Number(port), host, () => {
  console.log(`listening http://${host}:${server.address().port}`);
});
process.on('SIGTERM', () => server.close(() => process.exit(0)));
