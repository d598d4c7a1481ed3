package group

// HeartbeatError is heartbeatError, for the test that holds kafka-go's
// reading of heartbeat responses.
var HeartbeatError = heartbeatError
