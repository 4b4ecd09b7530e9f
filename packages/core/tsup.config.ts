import { packageConfig } from "../../tsup.shared.js"

export default packageConfig(["src/index.ts", "src/testing/index.ts"], { external: ["vitest", "@effect/vitest"] })
