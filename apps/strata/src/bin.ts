#!/usr/bin/env node
/**
 * Process entry of the `strata` command. A failure is reported by the CLI
 * itself (one line on stderr, the full cause with `--verbose`); the process
 * exits 2 after a usage error, 1 after any other failure, and 0 when it ends
 * on SIGINT or SIGTERM (a server's clean shutdown).
 *
 * @since 0.1.0
 */
import { NodeRuntime, NodeServices } from "@effect/platform-node"
import { Cause, Effect, Exit, Runtime } from "effect"
import { run } from "./Cli.js"

NodeRuntime.runMain(run.pipe(Effect.provide(NodeServices.layer)), {
  teardown: (exit, onExit) =>
    Exit.isFailure(exit) && Cause.hasInterruptsOnly(exit.cause) ? onExit(0) : Runtime.defaultTeardown(exit, onExit)
})
