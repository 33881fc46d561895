// POST /orders and POST /orders/:id/refunds on NestJS 10, made idempotent
// by @node-idempotency/nestjs as its README says: NodeIdempotencyModule
// registered with the memory adapter and @Idempotent() on the controller.
// Plain JavaScript, so the decorators are applied by Reflect.decorate
// where TypeScript would write @.
require('reflect-metadata');
const { Module, Controller, Get, Post, HttpCode, Body, Param, Res, Headers, HttpException } = require('@nestjs/common');
const { NestFactory } = require('@nestjs/core');
const { NodeIdempotencyModule, Idempotent } = require('@node-idempotency/nestjs');

const orders = new Map();
let next = 0;
// X-Test-Delay-Ms makes a request take that long (the overrides' slow request).
const delay = (ms) => new Promise((resolve) => setTimeout(resolve, Math.min(Number(ms) || 0, 5000)));
// X-Test-Fail: 1 makes a request answer 500 having made nothing (the
// overrides' fail request); X-Test-Large: 1 gives what it makes a note of
// 1.5 MiB (the overrides' large request).
const fail = (test) => {
  if (test['x-test-fail'] === '1') throw new HttpException({ error: 'failed as X-Test-Fail asked' }, 500);
};
const large = (test, made) => (test['x-test-large'] === '1' ? { ...made, note: 'x'.repeat(1536 * 1024) } : made);

class OrdersController {
  async create(body, res, test) {
    await delay(test['x-test-delay-ms']);
    fail(test);
    const { amount, currency } = body || {};
    if (!Number.isInteger(amount) || amount < 1 || typeof currency !== 'string') {
      throw new HttpException({ error: 'amount (integer >= 1) and currency are required' }, 400);
    }
    const order = { id: `ord_${++next}`, amount, currency, refunded: 0 };
    orders.set(order.id, order);
    res.location(`/orders/${order.id}`);
    return large(test, order);
  }

  get(id) {
    const order = orders.get(id);
    if (!order) throw new HttpException({ error: 'no such order' }, 404);
    return order;
  }

  async refund(id, body, test) {
    await delay(test['x-test-delay-ms']);
    fail(test);
    const order = orders.get(id);
    if (!order) throw new HttpException({ error: 'no such order' }, 404);
    const { amount } = body || {};
    if (!Number.isInteger(amount) || amount < 1 || amount > order.amount - order.refunded) {
      throw new HttpException({ error: 'amount must be an integer from 1 to what is left of the order' }, 400);
    }
    order.refunded += amount;
    return large(test, { id: `re_${++next}`, order_id: order.id, amount });
  }
}

const method = (name, ...decorators) => {
  const proto = OrdersController.prototype;
  Reflect.decorate(decorators, proto, name, Object.getOwnPropertyDescriptor(proto, name));
};
const param = (name, index, decorator) => decorator(OrdersController.prototype, name, index);
method('create', Post(), HttpCode(201), Idempotent());
param('create', 0, Body());
param('create', 1, Res({ passthrough: true }));
param('create', 2, Headers());
method('get', Get(':id'));
param('get', 0, Param('id'));
method('refund', Post(':id/refunds'), HttpCode(201), Idempotent());
param('refund', 0, Param('id'));
param('refund', 1, Body());
param('refund', 2, Headers());
Reflect.decorate([Controller('orders')], OrdersController);

class AppModule {}
Reflect.decorate([Module({
  imports: [NodeIdempotencyModule.forRootAsync({ storage: { adapter: 'memory' } })],
  controllers: [OrdersController],
})], AppModule);

(async () => {
  const app = await NestFactory.create(AppModule, { logger: ['error'] });
  await app.listen(Number(process.env.PORT), '127.0.0.1');
  console.log(`listening http://127.0.0.1:${app.getHttpServer().address().port}`);
})();
