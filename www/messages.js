// The page's two message areas, shared by the records and workers panels:
// a sticky error bar (role=alert) and a status line (role=status).

const $ = (id) => document.getElementById(id);

/** Shows progress or an outcome in the status line (announced politely). */
export function showStatus(text) {
  $('status').textContent = text;
}

export function clearError() {
  $('error-bar').hidden = true;
  $('error').textContent = '';
}

/** Shows any thrown value as a readable message (name, code, status, message). */
export function showError(err, context) {
  const el = $('error');
  el.textContent = `${context ? context + ': ' : ''}${describeError(err)}`;
  $('error-bar').hidden = false;
}

export function describeError(err) {
  if (err instanceof Error) {
    const tags = [err.name, err.code, err.status].filter((x) => x !== undefined && x !== '');
    const failures = Array.isArray(err.failures) && err.failures.length
      ? ` (${err.failures.length} failing position(s), first: #${err.failures[0].index} ${err.failures[0].message})`
      : '';
    return `${err.message}${failures} [${tags.join(' · ')}]`;
  }
  return String(err);
}

/** An Error with the SDK's shape: `name`, `code`, `status`. */
export function demoError(name, code, message, status) {
  return Object.assign(new Error(message), { name, code, ...(status === undefined ? {} : { status }) });
}
