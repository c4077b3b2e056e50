// Starting a server that binds its own port (port 0) and reading the port
// from its stdout: shared by tests/e2e and bench/webdriver.mjs (geckodriver),
// and free of dependencies, so either can import it.
import { spawn } from 'node:child_process';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..');

/**
 * Spawns `cmd args` (a server told to listen on port 0, or on a port it must
 * keep, such as a restart's) and resolves once a line of its stdout matches
 * `listening` (whose group 1 is the port): `{child, port, base, stop()}`.
 * The server binds the port itself, so no other process can take it between
 * a "free port" probe and the bind (what `freePort()` callers risk on a busy
 * machine). Rejects when the child exits first or nothing matches within
 * `timeoutMs`. stdout is read for the child's whole life (a full pipe would
 * block it). `stop()` sends SIGTERM (to the child's process group when
 * `detached`), SIGKILL 10 s later if it is still there, and resolves when
 * the child has exited.
 */
export function spawnListening(cmd, args, { listening, env = {}, cwd = ROOT, timeoutMs = 30_000, detached = false }) {
  const child = spawn(cmd, args, { cwd, detached, env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'ignore'] });
  const signal = (sig) => {
    try {
      if (detached) process.kill(-child.pid, sig); // its whole process group
      else child.kill(sig);
    } catch { /* already gone */ }
  };
  const stop = async () => {
    if (child.pid === undefined || child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise((r) => child.once('exit', r));
    signal('SIGTERM');
    // Bounded: a child that ignores SIGTERM is killed after 10 s.
    let timer;
    const late = new Promise((r) => { timer = setTimeout(r, 10_000); });
    if (await Promise.race([exited.then(() => true), late.then(() => false)]) === false) {
      signal('SIGKILL');
      await exited;
    }
    clearTimeout(timer);
  };
  return new Promise((resolve, reject) => {
    let out = '';
    const fail = (why) => { clearTimeout(timer); stop(); reject(new Error(`${cmd} ${why}:\n${out ?? ''}`)); };
    const timer = setTimeout(() => fail(`printed no listening line within ${timeoutMs} ms`), timeoutMs);
    const onExit = () => fail('exited before listening');
    child.once('exit', onExit);
    // Not started at all (no such file, not executable): no 'exit' follows.
    child.once('error', (e) => fail(`could not be started (${e.message})`));
    child.stdout.on('data', (chunk) => {
      if (out === null) return;
      out += chunk.toString().replace(/\x1b\[[0-9;]*m/g, '');
      const m = listening.exec(out);
      if (!m) return;
      out = null;
      clearTimeout(timer);
      child.off('exit', onExit);
      const port = Number(m[1]);
      resolve({ child, port, base: `http://127.0.0.1:${port}`, stop });
    });
  });
}
