// Runs the official Durable Streams conformance suite against CONFORMANCE_TEST_URL.
import { runConformanceTests } from "@durable-streams/server-conformance-tests"

runConformanceTests({
  baseUrl: process.env.CONFORMANCE_TEST_URL,
  longPollTimeoutMs: Number(process.env.LONG_POLL_MS ?? 20000),
  subscriptions: process.env.CONFORMANCE_SUBSCRIPTIONS === "1",
})
