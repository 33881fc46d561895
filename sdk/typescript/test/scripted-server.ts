// A scripted in-process HTTP server for the tests: each request gets the next
// scripted answer, and every request is recorded, so a test can see exactly
// how many attempts went out and with which key.
import { after } from "node:test";
import assert from "node:assert/strict";
import http from "node:http";
import type { AddressInfo } from "node:net";

export type Step = (req: http.IncomingMessage, res: http.ServerResponse) => void;
export interface Seen {
  method: string;
  url: string;
  key: string | undefined;
  authorization: string | undefined;
  contentType: string | undefined;
  body: string;
}

export function reply(status: number, body: unknown, headers: Record<string, string> = {}): Step {
  return (_req, res) => {
    const type = status < 300 && status !== 202 ? "application/json" : "application/problem+json";
    res.writeHead(status, { "Content-Type": type, ...headers });
    res.end(JSON.stringify(body));
  };
}

/** A long operation's 202: the accepted, pending resource (application/json). */
export function accepted(body: unknown, headers: Record<string, string> = {}): Step {
  return reply(202, body, { "Content-Type": "application/json", "Retry-After": "1", ...headers });
}

export function problem(status: number, type: string, headers: Record<string, string> = {}): Step {
  return reply(status, { type: `https://oncekey.dev/problems/${type}`, title: type, status }, headers);
}

/** Kills the connection after reading the request: the client never learns the outcome. */
export const drop: Step = (req) => req.socket.destroy();

const servers: http.Server[] = [];
after(() => {
  for (const s of servers) {
    s.closeAllConnections();
    s.close();
  }
});

/** Serves the steps in order (the last one repeats) on 127.0.0.1 at a free port. */
export async function scripted(...steps: Step[]): Promise<{ url: string; seen: Seen[] }> {
  const seen: Seen[] = [];
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const key = req.headers["idempotency-key"];
      seen.push({
        method: req.method ?? "",
        url: req.url ?? "",
        key: Array.isArray(key) ? key.join(",") : key,
        authorization: req.headers.authorization,
        contentType: req.headers["content-type"],
        body: Buffer.concat(chunks).toString(),
      });
      const step = steps[Math.min(seen.length, steps.length) - 1];
      assert.ok(step);
      step(req, res);
    });
  });
  servers.push(server);
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return { url: `http://127.0.0.1:${port}`, seen };
}
