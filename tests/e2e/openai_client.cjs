// tests/e2e/openai_client.cjs — the official `openai` npm client against hyla-coordinator --http
// (run by tests/e2e/test_e2e_http.sh with Node). Prints one line per check, "ok: ..." or
// "FAIL: ...", and exits 1 if any failed.
//   node openai_client.cjs OPENAI_PACKAGE_DIR BASE_URL MODEL
'use strict';
const [pkgDir, baseURL, model] = process.argv.slice(2);
const mod = require(pkgDir);
const OpenAI = mod.OpenAI || mod.default || mod;
const client = new OpenAI({ baseURL, apiKey: 'not-checked', maxRetries: 0, timeout: 60000 });

let failed = 0;
function check(cond, what, detail) {
  if (cond) {
    console.log(`ok: ${what}`);
  } else {
    failed++;
    console.log(`FAIL: ${what}${detail === undefined ? '' : ': ' + JSON.stringify(detail)}`);
  }
}

async function main() {
  const models = await client.models.list();
  const ids = models.data.map((m) => m.id);
  check(ids.includes(model), 'models.list lists the model', ids);

  const base = { model, prompt: 'The state of a layer', max_tokens: 12, temperature: 0, ignore_eos: true };
  const plain = await client.completions.create(base);
  check(plain.object === 'text_completion' && plain.choices.length === 1, 'completions.create answers a completion', plain);
  check(plain.usage && plain.usage.completion_tokens === 12, 'usage.completion_tokens == max_tokens', plain.usage);
  check(plain.choices[0].finish_reason === 'length', 'finish_reason length', plain.choices[0]);

  let streamed = '';
  let finish = null;
  let usage = null;
  const stream = await client.completions.create({ ...base, stream: true, stream_options: { include_usage: true } });
  for await (const ch of stream) {
    if (ch.choices.length) {
      streamed += ch.choices[0].text;
      if (ch.choices[0].finish_reason) finish = ch.choices[0].finish_reason;
    }
    if (ch.usage) usage = ch.usage;
  }
  check(streamed === plain.choices[0].text, 'a streamed completion equals the plain one (greedy)', [streamed, plain.choices[0].text]);
  check(finish === 'length' && usage && usage.completion_tokens === 12, 'the stream ends with finish_reason and usage', [finish, usage]);

  const msgs = [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Hello!' }];
  const chat = await client.chat.completions.create({ model, messages: msgs, max_tokens: 6, temperature: 0, ignore_eos: true });
  check(chat.object === 'chat.completion' && chat.choices[0].message.role === 'assistant', 'chat.completions.create answers', chat);
  let chatStreamed = '';
  let role = null;
  const cs = await client.chat.completions.create({ model, messages: msgs, max_tokens: 6, temperature: 0, ignore_eos: true, stream: true });
  for await (const ch of cs) {
    const d = ch.choices[0] && ch.choices[0].delta;
    if (d && d.role) role = d.role;
    if (d && d.content) chatStreamed += d.content;
  }
  check(role === 'assistant' && chatStreamed === chat.choices[0].message.content, 'a streamed chat equals the plain one', [chatStreamed, chat.choices[0].message.content]);

  // the session_id extension goes through the client as an extra body field
  const first = await client.completions.create({ ...base, max_tokens: 4, session_id: 'new' });
  check(typeof first.session_id === 'string' && /^s-[0-9a-f]{16}$/.test(first.session_id), 'session_id "new" returns a durable session id', first);
  const second = await client.completions.create({ ...base, prompt: ' and more', max_tokens: 4, session_id: first.session_id });
  check(second.session_id === first.session_id && second.usage.prompt_tokens === 9, 'a second call continues the session (only the new prompt is appended)', second);

  try {
    await client.completions.create({ ...base, model: 'no-such-model' });
    check(false, 'an unknown model fails');
  } catch (e) {
    check(e.status === 404 && e.code === 'model_not_found', 'an unknown model is an APIError 404 model_not_found', { status: e.status, code: e.code, message: e.message });
  }
  try {
    await client.completions.create({ ...base, max_tokens: 0 });
    check(false, 'max_tokens 0 fails');
  } catch (e) {
    check(e.status === 400 && e.param === 'max_tokens', 'max_tokens 0 is an APIError 400 naming the field', { status: e.status, param: e.param });
  }
}

main().then(
  () => process.exit(failed ? 1 : 0),
  (e) => {
    console.log(`FAIL: unexpected error: ${e && e.stack ? e.stack : e}`);
    process.exit(1);
  },
);
