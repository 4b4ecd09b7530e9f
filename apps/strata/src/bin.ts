#!/usr/bin/env node
/**
 * Process entry of the `strata` command. A failure is reported by the CLI
 * itself (one line on stderr, the full cause with `--verbose`); the process
 * exits non-zero.
 *
 * @since 0.1.0
 */
import { NodeRuntime, NodeServices } from "@effect/platform-node"
import { Effect } from "effect"
import { run } from "./Cli.js"

NodeRuntime.runMain(run.pipe(Effect.provide(NodeServices.layer)))
