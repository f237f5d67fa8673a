"""The games ub knows out of the box, one module each holding all ub knows of that game (its
:class:`ub.games.rules.GameRules` subclass and the strategy code behind it).

==================  ==============  ==========  ========  ======  =======  ====  ======
module              game            legal       position  expert  perfect  tree  env fix
==================  ==============  ==========  ========  ======  =======  ====  ======
``tictactoe``       TicTacToe       yes         yes       yes     yes      yes
``nim``             Nim             yes         yes       yes     yes      yes
``kuhn_poker``      KuhnPoker       yes         yes       yes     yes      yes   yes
``connect_four``    ConnectFour     yes         yes
``simple_tak``      SimpleTak       yes         yes
``tower_of_hanoi``  TowerOfHanoi    yes         yes
``guess_the_number``  GuessTheNumber  yes
==================  ==============  ==========  ========  ======  =======  ====  ======
"""

from __future__ import annotations

from ub.games.builtin.connect_four import ConnectFourRules
from ub.games.builtin.guess_the_number import GuessTheNumberRules
from ub.games.builtin.kuhn_poker import KuhnPokerRules
from ub.games.builtin.nim import NimRules
from ub.games.builtin.simple_tak import SimpleTakRules
from ub.games.builtin.tictactoe import TicTacToeRules
from ub.games.builtin.tower_of_hanoi import TowerOfHanoiRules
from ub.games.rules import GameRules

BUILT_IN_RULES: tuple[type[GameRules], ...] = (
    ConnectFourRules, GuessTheNumberRules, KuhnPokerRules, NimRules, SimpleTakRules,
    TicTacToeRules, TowerOfHanoiRules,
)
"""Every built-in game's rules (the registry starts with them: :mod:`ub.games.registry`)."""
