// Drives a Weir node's Redis-protocol port with ioredis and node-redis, as an application
// would: each client's own connect sequence, raw commands, a pipeline and a transaction
// (`multi`). Prints what came back as one JSON object; the Rust test judges it.
//
// Usage: node clients.js HOST PORT

const Redis = require("ioredis");
const { createClient } = require("redis");

async function ioredis(host, port) {
  const client = new Redis({ host, port, maxRetriesPerRequest: 1, lazyConnect: true });
  await client.connect();
  const out = {};
  out.throttle = await client.call("CL.THROTTLE", "io", 4, 1, 60);
  out.pipeline = (
    await client
      .pipeline()
      .call("CL.THROTTLE", "io-pipe", 4, 1, 60)
      .call("CL.THROTTLE", "io-pipe", 4, 1, 60)
      .exec()
  ).map(([error, reply]) => (error ? String(error) : reply[2]));
  out.multi = (
    await client
      .multi()
      .call("CL.THROTTLE", "io-tx", 4, 1, 60)
      .call("CL.THROTTLE", "io-tx", 4, 1, 60)
      .exec()
  ).map(([error, reply]) => (error ? String(error) : reply[2]));
  const acquired = await client.call("WEIR.ACQUIRE", "search", "io");
  out.acquired = acquired.map((v) => (Buffer.isBuffer(v) ? v.toString() : v));
  // A discarded transaction takes nothing.
  const discarded = client.multi();
  discarded.call("CL.THROTTLE", "io-tx", 4, 1, 60);
  await discarded.discard();
  out.after = (await client.call("CL.THROTTLE", "io-tx", 4, 1, 60))[2];
  client.disconnect();
  return out;
}

async function nodeRedis(host, port) {
  const client = createClient({ socket: { host, port, reconnectStrategy: false } });
  client.on("error", () => {});
  await client.connect();
  const out = {};
  out.throttle = await client.sendCommand(["CL.THROTTLE", "nr", "4", "1", "60"]);
  out.multi = (
    await client
      .multi()
      .addCommand(["CL.THROTTLE", "nr-tx", "4", "1", "60"])
      .addCommand(["CL.THROTTLE", "nr-tx", "4", "1", "60"])
      .exec()
  ).map((reply) => reply[2]);
  out.pipeline = (
    await Promise.all([
      client.sendCommand(["CL.THROTTLE", "nr-pipe", "4", "1", "60"]),
      client.sendCommand(["CL.THROTTLE", "nr-pipe", "4", "1", "60"]),
    ])
  ).map((reply) => reply[2]);
  out.acquired = await client.sendCommand(["WEIR.ACQUIRE", "search", "nr"]);
  await client.quit();
  return out;
}

async function main() {
  const [host, port] = process.argv.slice(2);
  const out = {
    ioredis: await ioredis(host, Number(port)),
    node_redis: await nodeRedis(host, Number(port)),
  };
  console.log(JSON.stringify(out));
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
