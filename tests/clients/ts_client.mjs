// The official TypeScript client against tiered with a bearer token, unchanged:
// create, append, idempotent producer, catch-up read, long-poll and SSE reads; and
// the same calls without the token, which must fail with 401.
// Usage: node ts_client.mjs <stream url> <token>; prints one JSON object.
import { DurableStream, IdempotentProducer, stream } from "@durable-streams/client"

const [url, token] = process.argv.slice(2)
const headers = { Authorization: `Bearer ${token}` }
const out = {}

const handle = await DurableStream.create({ url, headers, contentType: "text/plain" })
await handle.append("one,")
await handle.append("two,")
const producer = new IdempotentProducer(handle, "ts-producer", { autoClaim: true })
producer.append("three,")
producer.append("four")
await producer.flush()
await producer.close()
out.catchUp = await (await stream({ url, headers, live: false })).text()

for (const live of ["long-poll", "sse"]) {
  const res = await stream({ url, headers, offset: "-1", live })
  const seen = await new Promise((resolve, reject) => {
    let text = ""
    const timer = setTimeout(() => reject(new Error(`${live}: timed out with ${text}`)), 15000)
    res.subscribeText(async (chunk) => {
      text += chunk.text
      if (text.endsWith("four")) {
        clearTimeout(timer)
        resolve(text)
      }
    })
  })
  res.cancel()
  out[live] = seen
}

try {
  await stream({ url, live: false, backoffOptions: { maxRetries: 0 } }).then((r) => r.text())
  out.withoutToken = "accepted"
} catch (e) {
  out.withoutToken = e.status ?? String(e)
}
try {
  await new DurableStream({ url, headers: { Authorization: "Bearer tdt_aaaaaaaaaaaaaaaaaaaa_nope" } }).append("x")
  out.badToken = "accepted"
} catch (e) {
  out.badToken = e.status ?? String(e)
}
console.log(JSON.stringify(out))
process.exit(0)
