#!/usr/bin/env node
/**
 * Process entry of the `strata` command.
 *
 * @since 0.1.0
 */
import { NodeRuntime, NodeServices } from "@effect/platform-node"
import { Effect } from "effect"
import { run } from "./Cli.js"

NodeRuntime.runMain(run.pipe(Effect.provide(NodeServices.layer)))
