// The other modalities through the official `openai` Node SDK, unmodified
// (issue 14 point 2), against a running arbiter. Run by
// tests/modalities_e2e_test.cc with NODE_PATH at the installed client
// packages. usage: node modalities_sdk.mjs PORT PNG_PATH
// Prints one JSON line of what it measured; exits 1 with the failures.
import fs from 'node:fs';
import OpenAI, { toFile } from 'openai';

const [port, png] = process.argv.slice(2);
const base = `http://127.0.0.1:${port}`;
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused' });
const fails = [];
const out = {};
const sentence = 'the quick brown fox jumps over the lazy dog';

// speech: every format; the default is MP3, as OpenAI's
for (const format of ['wav', 'pcm', undefined]) {
  try {
    const r = await client.audio.speech.create({ model: 'tts', voice: 'slt', input: sentence,
                                                 ...(format ? { response_format: format } : {}) });
    const bytes = Buffer.from(await r.arrayBuffer());
    out[`speech_${format ?? 'default'}_bytes`] = bytes.length;
    out[`speech_${format ?? 'default'}_rate`] = r.headers.get('x-sample-rate');
    if (format === 'wav') {
      out.wav = bytes;
      if (bytes.subarray(0, 4).toString() !== 'RIFF') fails.push('speech wav: no RIFF header');
    } else if (!format) {
      const id3 = bytes.subarray(0, 3).toString() === 'ID3';
      const sync = bytes[0] === 0xff && (bytes[1] & 0xe0) === 0xe0;
      if (!id3 && !sync) fails.push('speech default: not MP3');
    }
  } catch (e) { fails.push(`speech ${format}: ${e.message}`); }
}

// transcription of the WAV, in three response formats
if (out.wav) {
  try {
    const t = await client.audio.transcriptions.create({
      model: 'asr', file: await toFile(out.wav, 'speech.wav', { type: 'audio/wav' }) });
    out.heard = t.text;
    const got = new Set(t.text.toLowerCase().split(/\s+/));
    out.words = sentence.split(' ').filter((w) => got.has(w)).length;
    if (out.words < 6) fails.push(`transcription heard "${t.text}"`);
    const v = await client.audio.transcriptions.create({
      model: 'asr', response_format: 'verbose_json',
      file: await toFile(out.wav, 'speech.wav', { type: 'audio/wav' }) });
    out.segments = v.segments?.length ?? 0;
    if (!(v.duration > 1) || out.segments < 1) fails.push('verbose_json: no duration/segments');
    const text = await client.audio.transcriptions.create({
      model: 'asr', response_format: 'text',
      file: await toFile(out.wav, 'speech.wav', { type: 'audio/wav' }) });
    if (typeof text !== 'string' || !text.includes('fox')) fails.push(`text format: ${text}`);
    try {
      await client.audio.transcriptions.create({
        model: 'asr', temperature: 0.5, file: await toFile(out.wav, 'speech.wav') });
      fails.push('temperature 0.5 was accepted');
    } catch (e) { if (e.status !== 400) fails.push(`temperature: ${e.status}`); }
  } catch (e) { fails.push(`transcription: ${e.message}`); }
  delete out.wav;
}

// an image in chat, read by the model's vision model
const b64 = fs.readFileSync(png).toString('base64');
try {
  const r = await client.chat.completions.create({ model: 'chat', max_tokens: 2, messages: [
    { role: 'user', content: [{ type: 'text', text: 'What does it say?' },
                              { type: 'image_url', image_url: { url: `data:image/png;base64,${b64}` } }] }] });
  out.image_prompt_tokens = r.usage.prompt_tokens;
  if (!(r.usage.prompt_tokens > 20)) fails.push('image chat: the vision text is not in the prompt');
  try {
    await client.chat.completions.create({ model: 'chat', max_tokens: 2, messages: [
      { role: 'user', content: [{ type: 'image_url', image_url: { url: 'https://example.com/a.png' } }] }] });
    fails.push('an https image URL was fetched or accepted');
  } catch (e) { if (e.status !== 400) fails.push(`https image: ${e.status}`); }
} catch (e) { fails.push(`image chat: ${e.message}`); }

// the describe extension, twice: the second answer comes from the vision cache
for (const round of [1, 2]) {
  const r = await fetch(`${base}/v1/vision/describe`, { method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ model: 'ocr', image: `data:image/png;base64,${b64}` }) });
  const j = await r.json();
  if (r.status !== 200) { fails.push(`describe ${round}: ${r.status} ${JSON.stringify(j)}`); break; }
  out[`describe_${round}_cached`] = j.cached;
  if (round === 1) {
    out.describe_text = j.text;
    if (!j.text.includes('4711') || j.lines.length < 2) fails.push(`describe: ${j.text}`);
  }
}

// VAD over multipart, with the platform's FormData
{
  const wav = Buffer.from(await (await client.audio.speech.create({
    model: 'tts', voice: 'kal', input: 'one two three', response_format: 'wav' })).arrayBuffer());
  const form = new FormData();
  form.append('model', 'vad');
  form.append('file', new Blob([wav], { type: 'audio/wav' }), 'a.wav');
  const r = await fetch(`${base}/v1/audio/vad`, { method: 'POST', body: form });
  const j = await r.json();
  out.vad_segments = j.segments?.length ?? -1;
  if (r.status !== 200 || !(j.segments?.length >= 1)) fails.push(`vad: ${r.status} ${JSON.stringify(j)}`);
}

console.log(JSON.stringify(out));
if (fails.length) { console.log('FAIL ' + fails.join('; ')); process.exit(1); }
