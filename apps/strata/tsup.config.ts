import { packageConfig } from "../../tsup.shared.js"

export default packageConfig(["src/bin.ts"], { clean: true, splitting: false })
