import { Errors, Log } from "@strata/core"

/** The Kafka error code names (apiId) of a client error and its nested errors. */
export const apiIds = (cause: unknown): Set<string> => {
  const out = new Set<string>()
  for (const e of Errors.causes(cause)) {
    const apiId = (e as { apiId?: unknown }).apiId
    if (typeof apiId === "string") out.add(apiId)
  }
  return out
}

const text = (cause: unknown): string => (cause instanceof Error ? cause.message : String(cause))

const isNetwork = (cause: unknown): boolean =>
  /ECONNREFUSED|ENOTFOUND|EHOSTUNREACH|ETIMEDOUT|ECONNRESET|Connection|Network|timed out|Timeout/i.test(
    `${(cause as { code?: unknown })?.code ?? ""} ${text(cause)} ${text((cause as { cause?: unknown })?.cause)}`
  )

/** Node's error codes for a TLS handshake the client refused: a broker certificate it does not accept, or no TLS at all. */
export const TLS_CERTIFICATE = Errors.TLS_REFUSAL

/** Whether a client failure is the brokers refusing its credentials, or a TLS handshake the client refused. */
export const isAuthentication = (cause: unknown): boolean => {
  const ids = apiIds(cause)
  if (ids.has("SASL_AUTHENTICATION_FAILED") || ids.has("UNSUPPORTED_SASL_MECHANISM") || ids.has("ILLEGAL_SASL_STATE"))
    return true
  return Errors.causes(cause).some((e) => {
    const code = (e as { code?: unknown }).code
    return code === "PLT_KFK_AUTHENTICATION" || (typeof code === "string" && TLS_CERTIFICATE.test(code))
  })
}

/** The messages in a failure's chain that say what the authentication failure was, each once. */
const authenticationDetail = (cause: unknown): string => {
  const messages = Errors.causes(cause).flatMap((e) => (e instanceof Error ? [e.message] : []))
  const relevant = [...new Set(messages.filter((m) => /SASL|authentic|certificate|TLS|SSL|mechanism/i.test(m)))]
  return relevant.length > 0 ? relevant.join(": ") : text(cause)
}

/** Whether the broker refused a produce request as too large (a record batch over the topic's `max.message.bytes`). */
export const isTooLarge = (cause: unknown): boolean => {
  const ids = apiIds(cause)
  return ids.has("MESSAGE_TOO_LARGE") || ids.has("RECORD_LIST_TOO_LARGE")
}

/** `BrokerUnreachable` for a request of `operation` that the brokers at `addresses` did not answer within `ms`. */
export const noAnswer = (operation: string, addresses: ReadonlyArray<string>, ms: number): Log.LogError =>
  Log.logError(
    new Log.BrokerUnreachable({
      brokers: [...addresses],
      detail: `${operation}: no answer from ${addresses.join(", ")} in ${ms} ms`
    })
  )

/** Maps a client failure of `operation` to a `LogError` reason. */
export const toLogError = (
  operation: string,
  brokers: ReadonlyArray<string>,
  cause: unknown,
  topic?: string
): Log.LogError => {
  const ids = apiIds(cause)
  if (isAuthentication(cause)) {
    return Log.logError(
      new Log.AuthenticationFailed({ brokers: [...brokers], detail: `${operation}: ${authenticationDetail(cause)}` })
    )
  }
  if (isTooLarge(cause)) {
    // Produce maps this itself, with the sizes (see kafkaProducer's `sendVia`); nothing else sends records.
    return Log.logError(
      new Log.InvalidRequest({ detail: `${operation}: the broker refused a record batch as too large` })
    )
  }
  if (ids.has("UNKNOWN_TOPIC_OR_PARTITION") || ids.has("UNKNOWN_TOPIC_ID") || /Unknown topic/i.test(text(cause))) {
    return Log.logError(new Log.UnknownTopic({ topic: topic ?? "" }))
  }
  if (ids.has("INVALID_TOPIC_EXCEPTION") || ids.has("INVALID_PARTITIONS") || ids.has("INVALID_RECORD")) {
    return Log.logError(new Log.InvalidRequest({ detail: `${operation}: ${[...ids].join(", ")}: ${text(cause)}` }))
  }
  const fenced = [...ids].find((id) =>
    /PRODUCER_FENCED|INVALID_PRODUCER_EPOCH|ILLEGAL_GENERATION|UNKNOWN_MEMBER_ID|FENCED_INSTANCE_ID|REBALANCE_IN_PROGRESS/.test(
      id
    )
  )
  if (fenced !== undefined) return Log.logError(new Log.Fenced({ detail: `${operation}: ${fenced}: ${text(cause)}` }))
  if (isNetwork(cause))
    return Log.logError(new Log.BrokerUnreachable({ brokers: [...brokers], detail: `${operation}: ${text(cause)}` }))
  const retryable = [...ids].some((id) =>
    /NOT_LEADER|LEADER_NOT_AVAILABLE|REQUEST_TIMED_OUT|NOT_ENOUGH_REPLICAS|NOT_COORDINATOR|COORDINATOR_LOAD/.test(id)
  )
  return Log.logError(
    new Log.IoError({
      operation,
      detail: ids.size > 0 ? `${[...ids].join(", ")}: ${text(cause)}` : text(cause),
      retryable
    })
  )
}

/** `TopicMismatch` for a topic that exists with another partition count. */
export const mismatch = (topic: string, expected: number, actual: number): Log.LogError =>
  Log.logError(new Log.TopicMismatch({ topic, expectedPartitions: expected, actualPartitions: actual }))
