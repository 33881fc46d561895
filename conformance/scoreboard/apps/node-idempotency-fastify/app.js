// POST /orders and POST /orders/:id/refunds on Fastify, made idempotent by
// @node-idempotency/core as its README says: onRequest before the handler
// (a stored answer is sent back as it is), onResponse after it. Its
// @node-idempotency/fastify plugin is not on npm, so these hooks are the
// few lines that plugin would be; the statuses of its errors are the ones
// @node-idempotency/shared maps them to, as its NestJS plugin does.
const fastify = require('fastify')();
const { Idempotency, IdempotencyError, IdempotencyErrorCodes } = require('@node-idempotency/core');
const { MemoryStorageAdapter } = require('@node-idempotency/storage-adapter-memory');
const { idempotency2HttpCodeMap } = require('@node-idempotency/shared');

const idempotency = new Idempotency(new MemoryStorageAdapter(), {});
const asRequest = (req) => ({ method: req.method, headers: req.headers, body: req.body, path: req.url });

// The requests onRequest let through to the handler: only their answers
// are stored (onResponse), as in the NestJS plugin. A replay or a refusal
// of the core ends no request that ran, and storing it would overwrite
// the key's record (the core's onResponse sets it whatever it holds).
const running = new WeakSet();

fastify.addHook('preHandler', async (req, reply) => {
  if (req.method !== 'POST') return;
  try {
    const stored = await idempotency.onRequest(asRequest(req));
    if (!stored) return void running.add(req);
    reply.header('Idempotent-Replayed', 'true');
    if (stored.additional.location) reply.header('Location', stored.additional.location);
    return reply.code(stored.additional.status).send(stored.body ?? stored.error);
  } catch (err) {
    if (!(err instanceof IdempotencyError)) throw err;
    if (err.code === IdempotencyErrorCodes.REQUEST_IN_PROGRESS) reply.header('Retry-After', '1');
    return reply.code(idempotency2HttpCodeMap[err.code] || 500).send({ error: err.message });
  }
});

fastify.addHook('onSend', async (req, reply, payload) => {
  if (!running.has(req)) return payload;
  const body = typeof payload === 'string' ? JSON.parse(payload) : payload;
  const additional = { status: reply.statusCode, location: reply.getHeader('Location') };
  await idempotency.onResponse(asRequest(req), reply.statusCode < 400 ? { body, additional } : { error: body, additional });
  return payload;
});

const orders = new Map();
let next = 0;
// X-Test-Delay-Ms makes a request take that long (the overrides' slow request).
const delay = (ms) => new Promise((resolve) => setTimeout(resolve, Math.min(Number(ms) || 0, 5000)));
// X-Test-Fail: 1 makes a request answer 500 having made nothing (the
// overrides' fail request); X-Test-Large: 1 gives what it makes a note of
// 1.5 MiB (the overrides' large request).
const failing = (req) => req.headers['x-test-fail'] === '1';
const large = (req, made) => (req.headers['x-test-large'] === '1' ? { ...made, note: 'x'.repeat(1536 * 1024) } : made);

fastify.post('/orders', async (req, reply) => {
  await delay(req.headers['x-test-delay-ms']);
  if (failing(req)) return reply.code(500).send({ error: 'failed as X-Test-Fail asked' });
  const { amount, currency } = req.body || {};
  if (!Number.isInteger(amount) || amount < 1 || typeof currency !== 'string') {
    return reply.code(400).send({ error: 'amount (integer >= 1) and currency are required' });
  }
  const order = { id: `ord_${++next}`, amount, currency, refunded: 0 };
  orders.set(order.id, order);
  return reply.code(201).header('Location', `/orders/${order.id}`).send(large(req, order));
});

fastify.get('/orders/:id', async (req, reply) => {
  const order = orders.get(req.params.id);
  if (!order) return reply.code(404).send({ error: 'no such order' });
  return order;
});

fastify.post('/orders/:id/refunds', async (req, reply) => {
  await delay(req.headers['x-test-delay-ms']);
  if (failing(req)) return reply.code(500).send({ error: 'failed as X-Test-Fail asked' });
  const order = orders.get(req.params.id);
  if (!order) return reply.code(404).send({ error: 'no such order' });
  const { amount } = req.body || {};
  if (!Number.isInteger(amount) || amount < 1 || amount > order.amount - order.refunded) {
    return reply.code(400).send({ error: 'amount must be an integer from 1 to what is left of the order' });
  }
  order.refunded += amount;
  return reply.code(201).send(large(req, { id: `re_${++next}`, order_id: order.id, amount }));
});

fastify.listen({ port: Number(process.env.PORT), host: '127.0.0.1' }).then(() => {
  console.log(`listening http://127.0.0.1:${fastify.server.address().port}`);
});
