// The official TypeScript client tails a stream from an offset a bootstrap read returned, unchanged:
// a catch-up read from it, then a long-poll read until the text ends with the marker.
// Usage: node ts_tail.mjs <stream url> <token> <offset> <marker>; prints one JSON object.
import { stream } from "@durable-streams/client"

const [url, token, offset, marker] = process.argv.slice(2)
const headers = { Authorization: `Bearer ${token}` }
const out = {}
out.catchUp = await (await stream({ url, headers, offset, live: false })).text()
const res = await stream({ url, headers, offset, live: "long-poll" })
out.live = await new Promise((resolve, reject) => {
  let text = ""
  const timer = setTimeout(() => reject(new Error(`timed out with ${text}`)), 30000)
  res.subscribeText(async (chunk) => {
    text += chunk.text
    if (text.endsWith(marker)) {
      clearTimeout(timer)
      resolve(text)
    }
  })
})
res.cancel()
console.log(JSON.stringify(out))
process.exit(0)
