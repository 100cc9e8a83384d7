// Score a batch with rewardd from Node.js (global fetch, Node 18+) and decode the run-length
// encoded advantages to dense arrays: what a trainer written in another language does.
//
// Usage: node score_rle.mjs BASE_URL REQUEST_JSON
// Prints {"<group_id>/<rollout_id>": {"reward": r, "advantages": [...]}, ...} as JSON.
// The request's advantage.output is forced to "rle" so the decoding is always exercised.

import { readFile } from "node:fs/promises";

/** [[value, length], ...] -> dense array (a scalar or null passes through unchanged). */
export function decodeRle(advantages) {
  if (advantages === null || typeof advantages === "number") return advantages;
  if (Array.isArray(advantages)) return advantages; // already dense
  const dense = [];
  for (const [value, length] of advantages.rle) {
    for (let i = 0; i < length; i += 1) dense.push(value);
  }
  return dense;
}

async function main() {
  const [baseUrl, requestPath] = process.argv.slice(2);
  if (!baseUrl || !requestPath) {
    console.error("usage: node score_rle.mjs BASE_URL REQUEST_JSON");
    process.exit(2);
  }
  const request = JSON.parse(await readFile(requestPath, "utf8"));
  request.advantage = { ...(request.advantage ?? {}), output: "rle" };
  const response = await fetch(`${baseUrl.replace(/\/$/, "")}/v1/score`, {
    method: "POST",
    headers: { "Content-Type": "application/json", Accept: "application/json" },
    body: JSON.stringify(request),
  });
  const body = await response.json();
  if (!response.ok) {
    console.error(`rewardd answered ${response.status}: ${JSON.stringify(body.detail ?? body)}`);
    process.exit(1);
  }
  const out = {};
  for (const group of body.groups) {
    for (const rollout of group.rollouts) {
      if (rollout.advantages !== null && !("rle" in Object(rollout.advantages))) {
        console.error(`rollout ${rollout.rollout_id}: expected run-length encoded advantages`);
        process.exit(1);
      }
      out[`${group.group_id}/${rollout.rollout_id}`] = {
        reward: rollout.reward,
        advantages: decodeRle(rollout.advantages),
      };
    }
  }
  process.stdout.write(JSON.stringify(out));
}

await main();
