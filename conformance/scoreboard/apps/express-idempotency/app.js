// POST /orders and POST /orders/:id/refunds behind express-idempotency,
// wired as its README says: the middleware on the POST routes, and each
// handler returning early on a hit (isHit) so a replay runs nothing.
const express = require('express');
const { idempotency, getSharedIdempotencyService } = require('express-idempotency');

const app = express();
app.use(express.json());
app.post('*', idempotency());

const orders = new Map();
let next = 0;
// X-Test-Delay-Ms makes a request take that long (the overrides' slow request).
const delay = (ms) => new Promise((resolve) => setTimeout(resolve, Math.min(Number(ms) || 0, 5000)));
// X-Test-Fail: 1 makes a request answer 500 having made nothing (the
// overrides' fail request); X-Test-Large: 1 gives what it makes a note of
// 1.5 MiB (the overrides' large request).
const failing = (req) => req.get('X-Test-Fail') === '1';
const large = (req, made) => (req.get('X-Test-Large') === '1' ? { ...made, note: 'x'.repeat(1536 * 1024) } : made);

app.post('/orders', async (req, res) => {
  if (getSharedIdempotencyService().isHit(req)) return;
  await delay(req.get('X-Test-Delay-Ms'));
  if (failing(req)) return res.status(500).json({ error: 'failed as X-Test-Fail asked' });
  const { amount, currency } = req.body || {};
  if (!Number.isInteger(amount) || amount < 1 || typeof currency !== 'string') {
    return res.status(400).json({ error: 'amount (integer >= 1) and currency are required' });
  }
  const order = { id: `ord_${++next}`, amount, currency, refunded: 0 };
  orders.set(order.id, order);
  res.status(201).location(`/orders/${order.id}`).json(large(req, order));
});

app.get('/orders/:id', (req, res) => {
  const order = orders.get(req.params.id);
  if (!order) return res.status(404).json({ error: 'no such order' });
  res.json(order);
});

app.post('/orders/:id/refunds', async (req, res) => {
  if (getSharedIdempotencyService().isHit(req)) return;
  await delay(req.get('X-Test-Delay-Ms'));
  if (failing(req)) return res.status(500).json({ error: 'failed as X-Test-Fail asked' });
  const order = orders.get(req.params.id);
  if (!order) return res.status(404).json({ error: 'no such order' });
  const { amount } = req.body || {};
  if (!Number.isInteger(amount) || amount < 1 || amount > order.amount - order.refunded) {
    return res.status(400).json({ error: 'amount must be an integer from 1 to what is left of the order' });
  }
  order.refunded += amount;
  const refund = { id: `re_${++next}`, order_id: order.id, amount };
  res.status(201).json(large(req, refund));
});

const server = app.listen(Number(process.env.PORT), '127.0.0.1', () => {
  console.log(`listening http://127.0.0.1:${server.address().port}`);
});
