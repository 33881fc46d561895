// charges.mjs makes charges with Stripe's Node SDK, as an application does,
// and prints what each call ended in: sdks_test.go runs it through the
// gateway. Each call has a Stripe client of its own, so that its attempts
// (the SDK's 'request' events, one per try) and the Idempotency-Key the SDK
// made for it are its own.
//
// Input (argv[2], JSON): {url, apiKey, timeout, maxNetworkRetries,
// sequential, calls: [{amount, metadata, idempotencyKey, startAfterMs}]};
// an idempotencyKey is the caller's, otherwise the SDK makes one; a call
// begins startAfterMs after the run does.
// Output (stdout, JSON): one result a call, in order: {key, attempts, ms,
// ok, body} when the call returned a charge (body: what the application
// got, as JSON), or {key, attempts, ms, ok: false, error: {class, type,
// statusCode, code, message}} when the SDK raised.
import Stripe from 'stripe';

const input = JSON.parse(process.argv[2]);
const url = new URL(input.url);

async function charge(call) {
  const stripe = new Stripe(input.apiKey, {
    host: url.hostname,
    port: Number(url.port),
    protocol: url.protocol.replace(':', ''),
    timeout: input.timeout,
    maxNetworkRetries: input.maxNetworkRetries,
  });
  const result = { key: call.idempotencyKey ?? '', attempts: 0 };
  stripe.on('request', (event) => {
    result.attempts++;
    result.key = event.idempotency_key ?? result.key;
  });
  if (call.startAfterMs) await new Promise((resolve) => setTimeout(resolve, call.startAfterMs));
  const start = Date.now();
  const options = call.idempotencyKey ? { idempotencyKey: call.idempotencyKey } : undefined;
  try {
    const body = await stripe.charges.create(
      { amount: call.amount, currency: 'usd', source: 'tok_visa', metadata: call.metadata },
      options,
    );
    Object.assign(result, { ok: true, body });
  } catch (err) {
    Object.assign(result, {
      ok: false,
      error: {
        class: err.constructor.name,
        type: err.rawType,
        statusCode: err.statusCode,
        code: err.code,
        message: err.message,
      },
    });
  }
  result.ms = Date.now() - start;
  return result;
}

const results = [];
if (input.sequential) {
  for (const call of input.calls) results.push(await charge(call));
} else {
  results.push(...(await Promise.all(input.calls.map(charge))));
}
process.stdout.write(JSON.stringify(results) + '\n');
