// POST /orders and POST /orders/{id}/refunds as one Lambda handler made
// idempotent by @aws-lambda-powertools/idempotency (makeIdempotent, the
// key from the Idempotency-Key header, method, path and body validated
// against the stored record) with its cache persistence layer on Redis.
// In front of it, a few lines stand in for API Gateway's REST proxy
// integration: the HTTP request becomes the event, the handler's result
// the answer, and an error thrown out of the handler (Powertools' own,
// such as IdempotencyAlreadyInProgressError) the 502 API Gateway answers.
const http = require('node:http');
const crypto = require('node:crypto');
const { createClient } = require('@redis/client');
const { makeIdempotent, IdempotencyConfig } = require('@aws-lambda-powertools/idempotency');
const { CachePersistenceLayer } = require('@aws-lambda-powertools/idempotency/cache');

const prefix = process.env.REDIS_PREFIX || `scoreboard-${process.pid}`;
const orders = new Map();
let next = 0;

const json = (statusCode, body, headers = {}) => ({
  statusCode, headers: { 'Content-Type': 'application/json', ...headers }, body: JSON.stringify(body),
});

// X-Test-Delay-Ms makes a request take that long (the overrides' slow request).
const delay = (ms) => new Promise((resolve) => setTimeout(resolve, Math.min(Number(ms) || 0, 5000)));
// The value of a test header of the event, whatever its case.
const test = (event, name) => (Object.entries(event.headers).find(([n]) => n.toLowerCase() === name) || [])[1];
// X-Test-Fail: 1 makes the handler return a 500 having made nothing (the
// overrides' fail request); X-Test-Large: 1 gives what it makes a note of
// 1.5 MiB (the overrides' large request), well within the 6 MB a Lambda
// may answer and the 10 MB of API Gateway, which this shim does not enforce.
const large = (event, made) => (test(event, 'x-test-large') === '1' ? { ...made, note: 'x'.repeat(1536 * 1024) } : made);

async function orderHandler(event) {
  await delay(test(event, 'x-test-delay-ms'));
  if (test(event, 'x-test-fail') === '1') return json(500, { error: 'failed as X-Test-Fail asked' });
  let body;
  try { body = JSON.parse(event.body || 'null') || {}; } catch { return json(400, { error: 'the body is not JSON' }); }
  if (event.resource === '/orders') {
    const { amount, currency } = body;
    if (!Number.isInteger(amount) || amount < 1 || typeof currency !== 'string') {
      return json(400, { error: 'amount (integer >= 1) and currency are required' });
    }
    const order = { id: `ord_${++next}`, amount, currency, refunded: 0 };
    orders.set(order.id, order);
    return json(201, large(event, order), { Location: `/orders/${order.id}` });
  }
  const order = orders.get(event.pathParameters.id);
  if (!order) return json(404, { error: 'no such order' });
  const { amount } = body;
  if (!Number.isInteger(amount) || amount < 1 || amount > order.amount - order.refunded) {
    return json(400, { error: 'amount must be an integer from 1 to what is left of the order' });
  }
  order.refunded += amount;
  return json(201, large(event, { id: `re_${++next}`, order_id: order.id, amount }));
}

// The API Gateway event of a request: REST API (v1) proxy integration.
function toEvent(req, rawBody) {
  const headers = {};
  for (let i = 0; i < req.rawHeaders.length; i += 2) headers[req.rawHeaders[i]] = req.rawHeaders[i + 1];
  const url = new URL(req.url, 'http://127.0.0.1');
  const refund = url.pathname.match(/^\/orders\/([^/]+)\/refunds$/);
  return {
    httpMethod: req.method, path: url.pathname, headers,
    resource: refund ? '/orders/{id}/refunds' : url.pathname,
    pathParameters: refund ? { id: decodeURIComponent(refund[1]) } : null,
    queryStringParameters: url.search ? Object.fromEntries(url.searchParams) : null,
    body: rawBody.length ? rawBody.toString('utf8') : null, isBase64Encoded: false,
    requestContext: { requestId: crypto.randomUUID(), httpMethod: req.method, resourcePath: url.pathname },
  };
}

const lambdaContext = () => {
  const deadline = Date.now() + 30_000;
  return { functionName: 'orders', awsRequestId: crypto.randomUUID(), getRemainingTimeInMillis: () => deadline - Date.now() };
};

(async () => {
  const client = await createClient({ url: process.env.REDIS_URL || 'redis://127.0.0.1:6379' }).connect();
  const handler = makeIdempotent(orderHandler, {
    persistenceStore: new CachePersistenceLayer({ client }),
    keyPrefix: prefix,
    config: new IdempotencyConfig({
      eventKeyJmesPath: 'headers."Idempotency-Key"',
      // POWERTOOLS_VALIDATE=0 leaves payload validation out (see docs/conformance.md).
      payloadValidationJmesPath: process.env.POWERTOOLS_VALIDATE === '0' ? undefined : '[httpMethod, path, body]',
      expiresAfterSeconds: 600,
    }),
  });

  const server = http.createServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', async () => {
      const url = new URL(req.url, 'http://127.0.0.1');
      const get = url.pathname.match(/^\/orders\/([^/]+)$/);
      if (req.method === 'GET' && get) {
        const order = orders.get(decodeURIComponent(get[1]));
        res.writeHead(order ? 200 : 404, { 'Content-Type': 'application/json' });
        return res.end(JSON.stringify(order || { error: 'no such order' }));
      }
      if (req.method !== 'POST' || !(url.pathname === '/orders' || /^\/orders\/[^/]+\/refunds$/.test(url.pathname))) {
        res.writeHead(404, { 'Content-Type': 'application/json' });
        return res.end('{"message":"Missing Authentication Token"}');
      }
      try {
        const result = await handler(toEvent(req, Buffer.concat(chunks)), lambdaContext());
        res.writeHead(result.statusCode, result.headers || {});
        res.end(result.body || '');
      } catch (err) {
        console.error(`${err.name}: ${err.message}`);
        res.writeHead(502, { 'Content-Type': 'application/json' });
        res.end('{"message": "Internal server error"}');
      }
    });
  });
  server.listen(Number(process.env.PORT), '127.0.0.1', () => {
    console.log(`listening http://127.0.0.1:${server.address().port}`);
  });

  // The run's records go with it: every key under this run's prefix.
  process.on('SIGTERM', async () => {
    server.close();
    for await (const keys of client.scanIterator({ MATCH: `${prefix}*`, COUNT: 500 })) {
      if (keys.length) await client.del(keys);
    }
    await client.quit();
    process.exit(0);
  });
})();
