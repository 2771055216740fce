// The gated loop driven by the official TypeScript MCP client
// (@modelcontextprotocol/sdk) against `bushost mcp`: integration/mcp_ts_test.go
// installs the SDK beside this file and runs it with the environment below.
// It prints one JSON line with what it saw; any failure throws (exit 1).
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const env = process.env;
const need = (name) => {
  if (!env[name]) throw new Error(`$${name} is not set`);
  return env[name];
};
const bushost = need("BUSHOST");

async function connect(token, cwd) {
  const transport = new StdioClientTransport({
    command: bushost,
    args: ["mcp"],
    cwd,
    // The home and token as a harness's environment gives them: no flag.
    env: { PATH: need("PATH"), HOME: env.HOME ?? "/", GORACE: env.GORACE ?? "", BUSHOST_HOME: need("BUSHOST_HOME"), BUS_TOKEN_FILE: token },
    stderr: "inherit",
  });
  const client = new Client({ name: "bushost-ts-test", version: "1.0.0" });
  await client.connect(transport);
  return client;
}

async function call(client, name, args) {
  const r = await client.callTool({ name, arguments: args });
  if (r.isError) throw new Error(`${name} refused: ${JSON.stringify(r.structuredContent)}`);
  return r.structuredContent;
}

function git(dir, ...args) {
  return execFileSync("git", args, {
    cwd: dir,
    env: {
      PATH: need("PATH"), GIT_CONFIG_NOSYSTEM: "1", GIT_CONFIG_GLOBAL: "/dev/null",
      GIT_AUTHOR_NAME: "ts", GIT_AUTHOR_EMAIL: "ts@localhost", GIT_COMMITTER_NAME: "ts", GIT_COMMITTER_EMAIL: "ts@localhost",
    },
  }).toString().trim();
}

const workerDir = need("WORKER_DIR");
const worker = await connect(need("WORKER_TOKEN"), workerDir);
const reviewer = await connect(need("REVIEWER_TOKEN"), need("REVIEWER_DIR"));
const workerTools = (await worker.listTools()).tools.map((t) => t.name).sort();
const reviewerTools = (await reviewer.listTools()).tools.map((t) => t.name).sort();

await call(worker, "fetch_main", { repo: "w" });
const w = path.join(workerDir, "w");
fs.writeFileSync(path.join(w, "ts.txt"), "from the TypeScript client\n");
git(w, "add", "ts.txt");
git(w, "commit", "-q", "-m", "ts change");
const head = git(w, "rev-parse", "HEAD");
const pushed = await call(worker, "push_working", { repo: "w" });

// A refusal is a tool result, isError, with the reason as structured content.
const gate = await worker.callTool({ name: "task_close", arguments: {} });

const req = await call(worker, "review_request", {});
const fetched = await call(reviewer, "fetch_review", { repo: "r" });
const verdict = await call(reviewer, "review_verdict", { request: req.request_id, approve: true, comment: "ok", repo: "r" });
const landed = await call(worker, "task_land", {});

console.log(JSON.stringify({
  head,
  pushed: pushed.commit,
  fetched: fetched.commit,
  verdict: verdict.verdict,
  landed: landed.main_new,
  gate: { isError: gate.isError === true, reason: gate.structuredContent?.reason },
  workerTools,
  reviewerTools,
  server: worker.getServerVersion()?.name,
}));
await worker.close();
await reviewer.close();
