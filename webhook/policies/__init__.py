"""The compiled admission policies kept written by the leader (`writer.PolicyWriter`)."""
