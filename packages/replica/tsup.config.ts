import { packageConfig } from "../../tsup.shared.js"

export default packageConfig(["src/index.ts", "src/log/index.ts"])
