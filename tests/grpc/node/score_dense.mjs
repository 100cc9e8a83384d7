// A second language against rewardd.v1 over gRPC: Node.js with @grpc/grpc-js and
// @grpc/proto-loader scores a batch with output "dense", decodes the RaggedFloat32 (packed
// little-endian float32 with row offsets) to one array per rollout, sends a bad request, and
// prints both as JSON for tests/grpc/test_node_client.py to compare with Python's answers.
//
// usage: node score_dense.mjs HOST:PORT API_KEY PROTO_PATH
import grpc from "@grpc/grpc-js";
import protoLoader from "@grpc/proto-loader";

const [target, key, protoPath] = process.argv.slice(2);
const definition = protoLoader.loadSync(protoPath, {
  keepCase: true, longs: Number, enums: String, defaults: false, oneofs: true,
});
const { rewardd } = grpc.loadPackageDefinition(definition);
const client = new rewardd.v1.Rewardd(target, grpc.credentials.createInsecure());
const metadata = new grpc.Metadata();
metadata.add("authorization", `Bearer ${key}`);

const text = (s) => ({ stringValue: s });
const f32 = (values) => {
  const buf = Buffer.alloc(4 * values.length);
  values.forEach((v, i) => buf.writeFloatLE(v, 4 * i));
  return { data_f32le: buf };
};
const rollout = (rollout_id, completion, num_tokens, extra = {}) =>
  ({ rollout_id, completion, num_tokens, ...extra });

const request = {
  groups: [
    { group_id: "HumanEval/0", prompt: "What is 2+2?",
      reference: { fields: { answer: text("4") } },
      rollouts: [rollout("a", "\\boxed{4}", 5), rollout("b", "\\boxed{5}", 3),
                 rollout("c", "it is \\boxed{4}", 7, { mask: f32([1, 1, 0, 0, 1, 1, 1]) }),
                 rollout("d", "no idea", 1)] },
    { group_id: "g2", prompt: "Solve 3x = 9", reference: { fields: { answer: text("3") } },
      rollouts: [rollout("e", "x = \\boxed{3}", 4), rollout("f", "x = \\boxed{2}", 2)] },
  ],
  rewards: [{ name: "math", verifier: "math" }],
  advantage: { estimator: "grpo", output: "dense" },
};

function decodeRagged(ragged) {
  const data = ragged.data_f32le;
  const offsets = ragged.row_offsets.map(Number);
  const rows = [];
  for (let i = 0; i + 1 < offsets.length; i++) {
    const row = [];
    for (let j = offsets[i]; j < offsets[i + 1]; j++) row.push(data.readFloatLE(4 * j));
    rows.push(row);
  }
  return rows;
}

const call = (method, body) => new Promise((resolve) => {
  client[method](body, metadata, { deadline: Date.now() + 60000 }, (error, reply) =>
    resolve({ error, reply }));
});

const scored = await call("Score", request);
if (scored.error) {
  console.error(`Score failed: ${scored.error.code} ${scored.error.details}`);
  process.exit(1);
}
const reply = scored.reply;
const bad = structuredClone(request);
bad.groups[0].rollouts[0].num_tokens = 4;
bad.groups[0].rollouts[0].mask = f32([1, 1, 1, 1, 1]);
const refused = await call("Score", bad);
console.log(JSON.stringify({
  kind: reply.advantages.values,
  rows: decodeRagged(reply.advantages.dense),
  rollout_ids: reply.groups.flatMap((g) => g.rollouts.map((r) => r.rollout_id)),
  rewards: reply.groups.flatMap((g) => g.rollouts.map((r) => r.reward)),
  error: refused.error ? { code: refused.error.code, details: refused.error.details } : null,
}));
client.close();
