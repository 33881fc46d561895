// A client killed with SIGKILL at "send", then run again: see ./journal-kill.ts.
import { killRounds } from "./journal-kill.js";

killRounds("send");
