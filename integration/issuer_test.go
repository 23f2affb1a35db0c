package integration

// audience is the audience the gateway under test expects of the test
// issuer's tokens (oidctest).
const audience = "https://fleet.test/mcp"
