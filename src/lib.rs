//! agentstore SDK
