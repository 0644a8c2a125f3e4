// Running one framework case over many seeds (tests/clients/frameworks/):
// the demo chat model has random weights, so its output varies with the
// seed and each seed is another draw through the constrained grammar.
//
//   await forEachSeed(SEEDS, async seed => { ... assert ... });
//
// Every seed runs, at most `concurrency` at a time (the server queues what
// its KV slots cannot take at once), and the test then fails naming every
// seed whose answer did not hold, with its error.
import assert from 'node:assert/strict';

// The seeds every case runs with (20 draws each).
export const SEEDS = Array.from({ length: 20 }, (_, i) => 1000 + 7 * i);

export async function forEachSeed(seeds, one, { concurrency = 4 } = {}) {
  const failures = [];
  let next = 0;
  const worker = async () => {
    while (next < seeds.length) {
      const seed = seeds[next++];
      try {
        await one(seed);
      } catch (e) {
        const detail = e?.cause ? ` (cause: ${e.cause?.message ?? e.cause})` : '';
        failures.push(`seed ${seed}: ${e?.message ?? e}${detail}`);
      }
    }
  };
  await Promise.all(Array.from({ length: concurrency }, worker));
  failures.sort();
  assert.equal(failures.length, 0,
               `${failures.length} of ${seeds.length} seeds failed:\n${failures.join('\n')}`);
}
